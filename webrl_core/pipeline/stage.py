"""A stage declares the config sections it reads, next to its definition, and can read no other.

    @stage("run", "models", "critic")
    def init_critic(settings, run_dir, actor_ref): ...

The Prefect task of a stage (``tasks/stages.py``) passes it only those sections, so they alone make up the
task's cache key and the stage's output key: a knob of another section never re-runs it. A stage that reads
an undeclared section would silently see that section's defaults there; instead ``settings`` is a view that
raises ``UndeclaredConfigSection`` naming the stage and the section. A stage called from another stage sees the
sections both declare.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from webrl_core.config import WebRLSettings

SECTIONS: tuple[str, ...] = tuple(WebRLSettings.model_fields)
"""Every top-level config section."""

STAGES: dict[str, Callable] = {}
"""name -> stage function, in definition order."""


class UndeclaredConfigSection(Exception):
    """A stage read a config section it does not declare (not an AttributeError, so ``getattr(s, name, default)``
    cannot turn it into a silent default)."""


class StageSettings:
    """``WebRLSettings`` restricted to the sections a stage declares (reading any other raises)."""

    def __init__(self, settings: WebRLSettings, sections: tuple[str, ...], stage_name: str):
        self._settings, self._sections, self._stage = settings, sections, stage_name

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # our own fields before __init__ ran (unpickling on a Ray worker, copy)
            raise AttributeError(name)
        if name in SECTIONS and name not in self._sections:
            raise UndeclaredConfigSection(
                f"stage {self._stage!r} reads config section {name!r} but declares only {list(self._sections)}: "
                f"add it to the stage's @stage(...) sections")
        return getattr(self._settings, name)

    def model_dump(self, **kw) -> dict:
        """The declared sections (what the stage's output key and a launched child process see)."""
        full = self._settings.model_dump(**kw)
        return {k: full[k] for k in self._sections}

    def model_dump_json(self, **kw) -> str:
        return self.settings().model_dump_json(**kw)

    def settings(self) -> WebRLSettings:
        """A plain ``WebRLSettings`` of the declared sections (the rest at defaults)."""
        return WebRLSettings.model_validate(self.model_dump(mode="json"))

    def __repr__(self) -> str:
        return f"StageSettings({self._stage!r}, sections={list(self._sections)})"


def scope(settings: WebRLSettings | StageSettings, sections: tuple[str, ...], stage_name: str) -> StageSettings:
    """``settings`` as stage ``stage_name`` may read it; a view of a view keeps only sections both allow."""
    if isinstance(settings, StageSettings):
        allowed = tuple(s for s in sections if s in settings._sections)
        return StageSettings(settings._settings, allowed, f"{stage_name} (called by {settings._stage})")
    return StageSettings(settings, sections, stage_name)


def stage(*sections: str) -> Callable[[Callable], Callable]:
    """Declare a stage and the config sections it reads; its first argument is the settings. A stage that
    declares none reads no config and takes no settings."""
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        raise ValueError(f"@stage: unknown config section(s) {unknown}; sections: {list(SECTIONS)}")

    def declare(fn: Callable) -> Callable:
        if not sections:
            fn.config_sections = ()
            STAGES[fn.__name__] = fn
            return fn

        @functools.wraps(fn)
        def run(settings, *args, **kwargs):
            return fn(scope(settings, sections, fn.__name__), *args, **kwargs)

        run.config_sections = sections
        STAGES[fn.__name__] = run
        return run

    return declare


def config_for(settings: WebRLSettings, stage_fn: Callable) -> dict:
    """The sections ``stage_fn`` declares, as plain JSON (a Prefect task's cache input)."""
    return scope(settings, stage_fn.config_sections, stage_fn.__name__).model_dump(mode="json")
