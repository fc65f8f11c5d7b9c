"""How `pytest -n 2` (the README's test command) shares the suite between its two workers.

* The longest work runs first, so the short tests fill the workers' gaps at the end: the smoke run's files, then the
  other long end-to-end tests (marked `slow`), then the rest.
* Each test file is one unit of work, so a file's module fixtures (a Ray cluster, a browser, a served model) start
  once, on one worker. The files that take the flow tests' session smoke run (`smoke_run`, tests/flows/conftest.py)
  are one unit together: that run is trained once per worker that needs it.
* Each worker, and every process it starts, gets an equal share of the cores for torch (OMP_NUM_THREADS): two
  workers of two torch threads each on two cores spin waiting for each other.

Without xdist (`pytest tests`) only the order applies. The units come from a scheduler of our own, because xdist
3.8's `--dist loadgroup` does not group under pytest 9.2: it renames `item._nodeid`, which pytest 9.2 no longer reads.
"""

from __future__ import annotations

import os

import pytest

SMOKE_RUN_FILES = {"tests/flows/test_flows.py", "tests/flows/test_ablate.py", "tests/flows/test_faults.py",
                   "tests/flows/test_docs_commands.py", "tests/flows/test_recipe_phases.py"}


def pytest_configure(config: pytest.Config) -> None:
    # models.dtype auto would train in bf16 on an AVX512-BF16/AMX box and float32 elsewhere; the suite's exact
    # comparisons (save/load round trips, micro-batches vs one batch, DDP vs in-process) are written for float32
    os.environ.setdefault("WEBRL_CPU_DTYPE", "float32")
    # a measured micro-batch differs between boxes and runs (webrl_core/learn/micro_batch.py): the suite keeps the
    # fixed one, and tests/learn/test_micro_batch.py measures
    os.environ.setdefault("WEBRL_CALIBRATE", "0")
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")  # set in a worker before its config exists
    if workers and "OMP_NUM_THREADS" not in os.environ:  # before anything imports torch
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // int(workers)))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank: dict[pytest.Item, int] = {}
    for item in items:
        rel = item.path.relative_to(config.rootpath).as_posix()
        if "smoke_run" in getattr(item, "fixturenames", ()) and rel not in SMOKE_RUN_FILES:
            raise pytest.UsageError(f"{rel} takes the smoke_run fixture: add it to SMOKE_RUN_FILES in tests/conftest.py")
        rank[item] = 0 if rel in SMOKE_RUN_FILES else 1 if item.get_closest_marker("slow") else 2
    items.sort(key=rank.__getitem__)  # stable: the files keep their order within a rank


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        """One unit of work per file, the smoke run's files one unit together; units in collection order."""

        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "smoke-run" if path in SMOKE_RUN_FILES else path

    config.option.loadscopereorder = False  # keep the order above (xdist would sort units by their number of tests)
    return FileScheduling(config, log)
