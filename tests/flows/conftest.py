"""One real Prefect server for the flow tests of a session: their `webrl` commands talk to it
through PREFECT_API_URL instead of each starting Prefect's temporary server. That start is the largest fixed cost of
a command here: a one-task flow took 16.0 s with the temporary server and 4.6 s against a running one (2 cores).
The temporary server, what a user's `webrl bootstrap` gets with no PREFECT_API_URL, stays covered by the fault row
(tests/flows/test_faults.py), whose harness starts its commands without an API URL.
"""

from __future__ import annotations

import os
import time

import pytest

from shared_prefect import API_ENV, free_port


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
