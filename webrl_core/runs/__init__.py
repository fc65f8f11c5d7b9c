"""A run's records: the trajectory store (DuckDB/Parquet), versioned run directories, the run lock, MLflow
tracking, the HTML trajectory viewer and the result tables and plots.

    store     trajectories, steps and labels in DuckDB, exported to Parquet
    rundir    versioned outputs named by settings, inputs and library code
    runlock   one writer per run directory
    tracking  MLflow runs (one per flow run, nested per sub-flow)
    viewer    static HTML pages per episode and phase
    report    per-site success tables, plots, MLflow and Prefect artifacts
    loss_history  the loss history each training writes into its model folder, and a run's trainings

Layer: above the foundation modules (``webrl_core.config``, ``identity``, ``artifacts`` ...), below everything else.
"""
