"""Loading a config: YAML files (and their ``extends:`` chains) merged over the packaged defaults, ``--set``
overrides and the WebArena URL environment variables, validated into ``webrl_core.config.WebRLSettings``; its errors
(``ConfigError``) and their messages; dumping and describing a config.

Resolution order (later wins):

    packaged defaults (webrl_core/configs/default.yaml)
    -> the chain of ``extends:`` files (a path relative to the file, or a packaged name such as ``smoke``)
    -> the file itself
    -> overlay files (``--overlay``), in order
    -> ``--set section.key=value`` overrides (the value is parsed as YAML)
    -> WebArena URL environment variables (SHOPPING, SHOPPING_ADMIN, REDDIT, GITLAB, MAP, WIKIPEDIA,
       HOMEPAGE, or their ``WA_`` prefixed BrowserGym names) for ``sites.urls``

Unknown keys, wrong types and missing paths fail before any work starts, with one message that names the file,
the field and the allowed values (``ConfigError``). Renamed fields (``config.RENAMED``): the old dotted name is still
accepted for one release, in a YAML file and in ``--set``, with a ``DeprecationWarning`` and a logged warning that
name the old and the new name.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from webrl_core.config import (LOCAL_INPUT_FILES, LOCAL_INPUTS_DIR, PATH_MISSING, RENAMED, WebRLSettings, _deprecated,
                               migrate_renamed)
from webrl_core.errors import BadInput, MissingInput
from webrl_core.websites import ALL_SITES


class ConfigError(BadInput):
    """A config could not be loaded; the message names the file, the field and what is allowed."""


class ConfigFileMissing(ConfigError, MissingInput):
    """The config file (or an ``extends:`` parent) does not exist and is no packaged config."""


class ConfigPathMissing(ConfigError, MissingInput):
    """Every problem of the config is a file or folder it names that does not exist (exit code 1, as a missing
    ``--model`` folder)."""


def renamed_key(dotted: str) -> str:
    """The current name of a dotted ``--set`` key (warns when it is an old one)."""
    if dotted in RENAMED:
        _deprecated(f"--set {dotted}: config field {dotted!r} is deprecated, use {RENAMED[dotted]!r} (the old name "
                    f"is accepted until the next release)")
        return RENAMED[dotted]
    return dotted


def packaged_config(name: str) -> Path:
    """Path of a config shipped in webrl_core/configs (``smoke`` or ``smoke.yaml``)."""
    fname = name if name.endswith((".yaml", ".yml")) else f"{name}.yaml"
    return Path(str(resources.files("webrl_core") / "configs" / fname))


def packaged_config_names() -> list[str]:
    folder = Path(str(resources.files("webrl_core") / "configs"))
    return sorted(p.stem for p in folder.glob("*.yaml"))


def _resolve_ref(ref: str, base: Path | None) -> Path:
    cand = Path(os.path.expanduser(ref))
    # files only: a run directory named like a packaged config (runs/smoke) must not shadow it
    if not cand.is_absolute() and base is not None and (base.parent / cand).is_file():
        return base.parent / cand
    if cand.is_file():
        return cand
    pk = packaged_config(ref)
    if pk.exists():
        return pk
    where = f" (referenced from {base})" if base else ""
    if "/" not in ref and os.sep not in ref and not ref.endswith((".yaml", ".yml")):  # a name, not a path
        raise ConfigError(f"unknown config name {ref!r}{where}; packaged configs: {', '.join(packaged_config_names())} "
                          f"(`webrl config list`), or give the path of a YAML file")
    raise ConfigFileMissing(f"config file not found: {ref!r}{where}; packaged configs: {packaged_config_names()}")


def _deep_merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k != "urls":
            out[k] = _deep_merge(out[k], v)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = {**out[k], **v}
        else:
            out[k] = v
    return out


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    """Read a YAML file and the chain of files it ``extends:``."""
    if path.resolve() in seen:
        raise ConfigError(f"{path}: 'extends' cycle: {' -> '.join(map(str, seen + (path,)))}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}); expected a YAML config") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the config: {e.strerror or e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections, got {type(data).__name__}")
    try:
        data = migrate_renamed(data, str(path))  # per file, so the later file wins whichever name each uses
    except ValueError as e:
        raise ConfigError(str(e)) from None
    parent = data.pop("extends", None)
    if parent:
        parents = parent if isinstance(parent, list) else [parent]
        merged: dict = {}
        for p in parents:
            merged = _deep_merge(merged, _read_yaml(_resolve_ref(str(p), path), seen + (path.resolve(),)))
        data = _deep_merge(merged, data)
    return data


def _set_dotted(data: dict, dotted: str, raw: str) -> None:
    keys = dotted.split(".")
    cur = data
    for k in keys[:-1]:
        nxt = cur.setdefault(k, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"--set {dotted}={raw}: {k!r} is not a section")
        cur = nxt
    try:
        cur[keys[-1]] = yaml.safe_load(raw) if raw != "" else None
    except yaml.YAMLError:
        cur[keys[-1]] = raw


def env_site_urls(environ: dict[str, str] | None = None) -> dict[str, str]:
    """WebArena's URL env vars (and BrowserGym's WA_ names; the unprefixed name wins)."""
    environ = os.environ if environ is None else environ
    out = {}
    for site in ALL_SITES:
        var = site.upper()
        val = environ.get(var) or environ.get(f"WA_{var}")
        if val:
            out[site] = val.rstrip("/")
    return out


def _allowed_for(loc: tuple, model: type[BaseModel] = None) -> str:
    model = model or WebRLSettings
    for part in loc[:-1]:
        f = model.model_fields.get(part) if isinstance(part, str) else None
        ann = getattr(f, "annotation", None) if f else None
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
        else:
            return ""
    return ", ".join(sorted(model.model_fields))


def maker_command(path: str | Path) -> str | None:
    """The command that writes a missing input ``path`` when it is one of ``LOCAL_INPUT_FILES`` (in the default
    folder or another ``--dir``), else None: a config error then says how to make it."""
    p = Path(path)
    if p.name not in LOCAL_INPUT_FILES.values():
        return None
    where = "" if p.parent == Path(LOCAL_INPUTS_DIR) else f" --dir {p.parent}"
    return f"webrl webarena local-setup{where}"


def _missing_paths_error(errors: list[dict], source: str) -> ConfigPathMissing:
    """One line for configured paths that do not exist, with the command that writes them where one does."""
    named = [f"{'.'.join(str(p) for p in e['loc'])}={e['ctx']['path']!r}" for e in errors]
    makers = sorted({m for e in errors if (m := maker_command(e["ctx"]["path"]))})
    how = f"; `{'`, `'.join(makers)}` writes them" if makers else ""
    return ConfigPathMissing(f"config {source}: {len(named)} path(s) do not exist (relative to {Path.cwd()}): "
                             f"{', '.join(named)}{how}")


def _format_errors(err: ValidationError, source: str) -> str:
    """``invalid config SOURCE: field 'a.b': what is wrong (got VALUE)``: one line for one problem, else one line
    per field under the heading."""
    lines = []
    for e in err.errors():
        loc = tuple(e["loc"])
        field = ".".join(str(p) for p in loc)
        if e["type"] == "extra_forbidden":
            lines.append(f"field '{field}': unknown key; allowed keys here: {_allowed_for(loc)}")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            got = e.get("input")
            named = isinstance(got, dict) or (isinstance(got, str) and repr(got) in msg)  # the message shows it
            got_s = "" if named else f" (got {got!r})"
            lines.append(f"field '{field}': {msg}{got_s}")
    if len(lines) == 1:
        return f"invalid config {source}: {lines[0]}"
    return "\n".join([f"invalid config {source}:"] + [f"  {ln}" for ln in lines])


def load_config(path: str | Path | None = None, overlays: list[str | Path] = (),
                sets: list[str] = (), environ: dict[str, str] | None = None) -> WebRLSettings:
    """Resolve a config: defaults <- file (and its extends) <- overlays <- --set <- URL env vars."""
    data = _read_yaml(packaged_config("default"))
    source = str(packaged_config("default"))
    if path:
        p = _resolve_ref(str(path), None)
        data = _deep_merge(data, _read_yaml(p))
        source = str(p)
    for ov in overlays:
        p = _resolve_ref(str(ov), None)
        data = _deep_merge(data, _read_yaml(p))
        source += f" + {p}"
    for s in sets:
        if "=" not in s:
            raise ConfigError(f"--set {s!r}: expected section.key=value")
        k, v = s.split("=", 1)
        _set_dotted(data, renamed_key(k.strip()), v.strip())
        source += f" + --set {k.strip()}"
    env_urls = env_site_urls(environ)
    if env_urls:
        source += " + env " + ",".join(sorted(s.upper() for s in env_urls))
        data.setdefault("sites", {})
        data["sites"]["urls"] = {**(data["sites"].get("urls") or {}), **env_urls}
    try:
        return WebRLSettings.model_validate(data).check_combinations()
    except ValidationError as e:
        if all(err["type"] == PATH_MISSING for err in e.errors()):
            raise _missing_paths_error(e.errors(), source) from None
        raise ConfigError(_format_errors(e, source)) from None
    except ValueError as e:  # check_combinations: fields of two sections that do not go together
        raise ConfigError(f"invalid config {source}: {e}") from None


def dump_config(cfg: WebRLSettings) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def describe_fields(model: type[BaseModel] = WebRLSettings, prefix: str = "") -> list[tuple[str, str, Any]]:
    """(dotted name, description, default) for every leaf field: the config reference."""
    rows = []
    for name, f in model.model_fields.items():
        ann = f.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            rows += describe_fields(ann, f"{prefix}{name}.")
        else:
            default = f.get_default(call_default_factory=True)
            rows.append((f"{prefix}{name}", f.description or "", default))
    return rows
