"""`webrl` with the fault benchmark's probes installed (``webrl bench faults`` starts its runs with this).

``WEBRL_FAULT_PROBES`` names the probes' folder and ``WEBRL_FAULT_HOLD`` the probe to hold
(``benchmarks.faults.install_probes``).
"""

from __future__ import annotations

import os

from benchmarks.faults import HOLD_ENV, PROBE_ENV, install_probes


def main() -> None:
    if os.environ.get(PROBE_ENV):
        install_probes(os.environ[PROBE_ENV], os.environ.get(HOLD_ENV) or None)
    # imported after the probes: they replace stage functions that the CLI's flows bind when imported
    from webrl_cli.main import app

    app(prog_name="webrl")
