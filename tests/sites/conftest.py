"""Shared fixtures of the embedded-sites tests: one running EmbeddedSites for the session."""

from __future__ import annotations

import pytest

from webrl_core.sites.server import EmbeddedSites


@pytest.fixture(scope="session")
def sites():
    s = EmbeddedSites(data_seed=0).start()
    yield s
    s.stop()
