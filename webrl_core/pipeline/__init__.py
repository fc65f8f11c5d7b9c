"""The stages of WebRL's phase loop (paper, Algorithm 1) as plain functions; ``tasks/stages.py`` wraps each as a
cached Prefect task and ``flows/webrl.py`` composes them. Nothing here imports Prefect.

Each stage takes the settings (only the sections it declares with ``@stage``), the run directory, the phase and
content-addressed references (``ArtifactRef``) to its inputs; it writes versioned outputs under the run directory
(``webrl_core.runs.rundir``) and returns references to them plus small metrics.

    task_sets   training pools, the held-out test set, a phase's materialised tasks
    bootstrap   phase 0 of the embedded default: tokenizer, SFT actor, ORM, critic initialisation
    generation  in-breadth task generation from phase k-1's failures, critic filter
    experience  rollouts, labels (sites' evaluators or ORM), transitions, perplexity replay
    updates     critic update, then the KL-constrained actor update (reference = actor k-1)
    evaluation  success of an actor on the held-out test set
    validate    checks of a run's inputs before any work starts (preflight)
    local_webarena  the real path's inputs made on this machine (SFT data, a local actor and ORM)
"""
