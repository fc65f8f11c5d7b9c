"""The embedded WebArena-style sites: shopping, shopping_admin, reddit, gitlab and map apps, their task
families (with evaluators and scripted oracles), and the fixed held-out test set.

    with EmbeddedSites(data_seed=0) as sites:      # five servers on 127.0.0.1, one port each
        sites.urls                                  # {"shopping": "http://127.0.0.1:PORT", ...}
    test_set()            -> 165 fixed tasks         train_tasks(n, seed) -> sampled training tasks
    vary_task(task, rng)  -> same family, new instantiation      OraclePolicy() -> scripted expert
"""

from webrl_core.sites.oracle import OraclePolicy, oracle_response
from webrl_core.sites.server import EmbeddedSites
from webrl_core.sites.tasks import test_set, train_tasks, vary_task

__all__ = ["EmbeddedSites", "OraclePolicy", "oracle_response", "test_set", "train_tasks", "vary_task"]
