"""The flow tests' session fixtures: one real Prefect server, and one smoke run (bootstrap + phase 1) that the tests
of test_flows.py check and re-run and that the ablation and the fault row fork their phase 0 from.

The server: the session's `webrl` commands talk to it through PREFECT_API_URL instead of each starting Prefect's
temporary server. That start is the largest fixed cost of a command here: a one-task flow took 16.0 s with the
temporary server and 4.6 s against a running one (2 cores).
The temporary server, what a user's `webrl bootstrap` gets with no PREFECT_API_URL, stays covered by the fault row
(tests/flows/test_faults.py), whose harness starts its commands without an API URL.
"""

from __future__ import annotations

import os
import time

import pytest
import yaml

from webrl_core.hardware import free_port
from shared_prefect import API_ENV, webrl


@pytest.fixture(scope="session", autouse=True)
def prefect_api(tmp_path_factory):
    from webrl_cli.prefect_stack import PrefectStack

    root = tmp_path_factory.mktemp("prefect-server")
    stack = PrefectStack(root / "home", port=free_port(), run_root=root)
    t0 = time.perf_counter()
    stack.start_server()
    print(f"shared Prefect server: {time.perf_counter() - t0:.0f} s")
    os.environ[API_ENV] = stack.api
    try:
        yield stack.api
    finally:
        os.environ.pop(API_ENV, None)
        stack.stop()


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory, prefect_api):
    """`webrl bootstrap` and `webrl phase --phase 1` on the smoke config: (root, config file, run dir)."""
    root = tmp_path_factory.mktemp("flows")
    cfg = root / "smoke.yaml"
    cfg.write_text(yaml.safe_dump({"extends": "smoke", "run": {"name": "smoke", "root": str(root)}}))
    run = root / "smoke"
    t0 = time.perf_counter()
    webrl(root, "bootstrap", "--config", str(cfg))
    webrl(root, "phase", "--config", str(cfg), "--phase", "1")
    print(f"bootstrap + phase 1: {time.perf_counter() - t0:.0f} s")
    return root, cfg, run
