"""The websites a run acts in, for the length of a stage: the embedded sites (started and stopped here) or the
real WebArena sites at configured URLs. Either way the result is the env's site hooks (URLs, logins, resets)."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from webrl_core.env.browser import WebArenaHooks
from webrl_core.env.webarena_login import LOGIN_SITES
from webrl_core.sites.server import EmbeddedSites


@contextlib.contextmanager
def site_session(settings: Any) -> Iterator[Any]:
    """Site hooks for ``settings.sites``: ``mode: webarena`` uses its URLs, ``embedded`` starts the sites."""
    if settings.sites.mode == "webarena":
        yield WebArenaHooks(settings.sites.urls, auth_dir=settings.sites.auth_dir,
                            reset_command=settings.sites.reset_command, login_sites=LOGIN_SITES)
        return
    sites = EmbeddedSites(data_seed=settings.sites.data_seed, host=settings.sites.host, workers=settings.sites.workers)
    sites.start()
    try:
        yield sites
    finally:
        sites.stop()
