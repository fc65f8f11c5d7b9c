"""A stage declares the config sections it reads, next to its definition, and can read no other.

    @stage("run", "models", "critic")
    def init_critic(settings, run_dir, actor_ref): ...

The Prefect task of a stage (``tasks/stages.py``) passes it only those sections, so they alone make up the
task's cache key and the stage's output key: a knob of another section never re-runs it. A stage that reads
an undeclared section would silently see that section's defaults there; instead ``settings`` is a view that
raises ``UndeclaredConfigSection`` naming the stage and the section. A stage called from another stage sees the
sections both declare.

A stage that needs a few fields of a section declares them as ``"section.field"``:

    @stage("run", "bootstrap", "actor.batch_size", "actor.grad_accum")
    def sft_actor(settings, ...): ...

Only those fields key it (the SFT trains the actor's model with the actor's batch shape, but a new ``actor.lr``
must not retrain it); reading another field of the section raises ``UndeclaredConfigSection`` too.
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


def parse_declaration(declared: tuple[str, ...]) -> tuple[tuple[str, ...], dict[str, frozenset[str]]]:
    """``("run", "actor.batch_size", "actor.grad_accum")`` -> (("run", "actor"), {"actor": {"batch_size",
    "grad_accum"}}): the sections in declaration order, and the fields of the partly declared ones. A section
    declared whole and by field is declared whole."""
    unknown = sorted({d.partition(".")[0] for d in declared} - set(SECTIONS))
    if unknown:
        raise ValueError(f"@stage: unknown config section(s) {unknown}; sections: {list(SECTIONS)}")
    sections: list[str] = []
    fields: dict[str, set[str]] = {}
    whole: set[str] = set()
    for item in declared:
        section, _, field = item.partition(".")
        if field:
            known = WebRLSettings.model_fields[section].annotation.model_fields
            if field not in known:
                raise ValueError(f"@stage: config section {section!r} has no field {field!r}; fields: {list(known)}")
            fields.setdefault(section, set()).add(field)
        else:
            whole.add(section)
        if section not in sections:
            sections.append(section)
    return tuple(sections), {k: frozenset(v) for k, v in fields.items() if k not in whole}


class SectionFields:
    """One config section restricted to the fields a stage declares (reading another raises)."""

    def __init__(self, section: Any, name: str, fields: frozenset[str], stage_name: str):
        self._section, self._name, self._fields, self._stage = section, name, fields, stage_name

    def __getattr__(self, field: str) -> Any:
        if field.startswith("_"):
            raise AttributeError(field)
        if field not in self._fields:
            raise UndeclaredConfigSection(
                f"stage {self._stage!r} reads config field {self._name}.{field} but declares only "
                f"{sorted(f'{self._name}.{f}' for f in self._fields)} of that section: add it to the stage's "
                f"@stage(...) sections")
        return getattr(self._section, field)


class StageSettings:
    """``WebRLSettings`` restricted to the sections (or fields of a section) a stage declares; reading any other
    raises."""

    def __init__(self, settings: WebRLSettings, sections: tuple[str, ...], stage_name: str,
                 fields: dict[str, frozenset[str]] | None = None):
        self._settings, self._sections, self._stage = settings, sections, stage_name
        self._fields = dict(fields or {})

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # our own fields before __init__ ran (unpickling on a Ray worker, copy)
            raise AttributeError(name)
        if name in SECTIONS and name not in self._sections:
            raise UndeclaredConfigSection(
                f"stage {self._stage!r} reads config section {name!r} but declares only {list(self._sections)}: "
                f"add it to the stage's @stage(...) sections")
        if name in self._fields:
            return SectionFields(getattr(self._settings, name), name, self._fields[name], self._stage)
        return getattr(self._settings, name)

    def model_dump(self, **kw) -> dict:
        """The declared sections and fields (what the stage's output key and a launched child process see)."""
        full = self._settings.model_dump(**kw)
        return {k: ({f: v for f, v in full[k].items() if f in self._fields[k]} if k in self._fields else full[k])
                for k in self._sections}

    def model_dump_json(self, **kw) -> str:
        return self.settings().model_dump_json(**kw)

    def settings(self) -> WebRLSettings:
        """A plain ``WebRLSettings`` of the declared sections and fields (the rest at defaults)."""
        return WebRLSettings.model_validate(self.model_dump(mode="json"))

    def __repr__(self) -> str:
        return f"StageSettings({self._stage!r}, sections={list(self._sections)})"


def scope(settings: WebRLSettings | StageSettings, declared: tuple[str, ...], stage_name: str) -> StageSettings:
    """``settings`` as stage ``stage_name`` may read it (``declared``: as ``@stage`` takes them); a view of a view
    keeps only the sections and fields both allow."""
    sections, fields = parse_declaration(declared)
    if isinstance(settings, StageSettings):
        allowed = tuple(s for s in sections if s in settings._sections)
        both = {}
        for s in allowed:
            mine, theirs = fields.get(s), settings._fields.get(s)
            if mine is not None or theirs is not None:
                both[s] = mine & theirs if mine is not None and theirs is not None else (mine or theirs)
        return StageSettings(settings._settings, allowed, f"{stage_name} (called by {settings._stage})", both)
    return StageSettings(settings, sections, stage_name, fields)


def stage(*declared: str) -> Callable[[Callable], Callable]:
    """Declare a stage and the config sections (``"section"``) or fields (``"section.field"``) it reads; its first
    argument is the settings. A stage that declares none reads no config and takes no settings."""
    sections, _ = parse_declaration(declared)  # refuses unknown sections and fields at declaration

    def declare(fn: Callable) -> Callable:
        if not sections:
            fn.config_sections = ()
            STAGES[fn.__name__] = fn
            return fn

        @functools.wraps(fn)
        def run(settings, *args, **kwargs):
            return fn(scope(settings, declared, fn.__name__), *args, **kwargs)

        run.config_sections = sections
        run.config_declared = declared
        STAGES[fn.__name__] = run
        return run

    return declare


def config_for(settings: WebRLSettings, stage_fn: Callable) -> dict:
    """The sections and fields ``stage_fn`` declares, as plain JSON (a Prefect task's cache input)."""
    return scope(settings, getattr(stage_fn, "config_declared", ()), stage_fn.__name__).model_dump(mode="json")
