"""WebArena-Lite task files: validation, site-URL placeholder substitution, export, generated-task configs.

Contract (envs_spec §1.2-1.3, webrl_spec §5.4):

* A raw task file is a JSON list of task objects; each has the 13 keys of :data:`TASK_KEYS` with the types checked by
  :func:`task_errors`. Malformed tasks raise :class:`TaskFileError` naming the file, the task (index and task_id)
  and the field.
* Placeholders ``__SHOPPING__``, ``__SHOPPING_ADMIN__``, ``__REDDIT__``, ``__GITLAB__``, ``__MAP__``, ``__WIKIPEDIA__``,
  ``__HOMEPAGE__`` are replaced by site base URLs (no trailing "/") in every string of the task, eval included;
  multi-tab ``start_url`` values (`` |AND| ``) are substituted per tab. Sites missing from the given URLs fall back to
  WebArena's default ports on ``localhost`` (:func:`default_site_urls`).
* :func:`export_webarena` is the equivalent of VAB's ``generate_test_data.py``: ``<out>/<name>.json`` (the substituted
  list) plus ``<out>/<name>/<idx>.json`` per task, where ``<name>`` is the raw file name without ``.raw.json``.
* :func:`make_generated_task_config` builds the runnable config of an LLM-generated task (the official README template:
  dummy eval ``exact_match: "N/A"``, ``storage_state: ./.auth/<site>_state.json``, placeholder start_url).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any, Iterable

from webrl_core.env.evaluators import URL_RULES, parse_helper_call
from webrl_core.websites import SITES, TASK_CONFIG_SITES

PLACEHOLDERS = {"__SHOPPING__": "shopping", "__SHOPPING_ADMIN__": "shopping_admin", "__REDDIT__": "reddit",
                "__GITLAB__": "gitlab", "__MAP__": "map", "__WIKIPEDIA__": "wikipedia", "__HOMEPAGE__": "homepage"}
SITE_PLACEHOLDER = {site: ph for ph, site in PLACEHOLDERS.items()}
# WebArena's documented default ports (original repo README / env_config.py).
DEFAULT_PORTS = {"shopping": ":7770", "shopping_admin": ":7780/admin", "reddit": ":9999", "gitlab": ":8023",
                 "map": ":3000",
                 "wikipedia": ":8888/wikipedia_en_all_maxi_2022-05/A/User:The_other_Kiwix_guy/Landing",
                 "homepage": ":4399"}
AND_SEP = " |AND| "
TASK_KEYS = ("sites", "task_id", "old_task_id", "require_login", "storage_state", "start_url", "geolocation",
             "intent_template", "instantiation_dict", "intent", "require_reset", "eval", "intent_template_id")
EVAL_TYPES = ("string_match", "url_match", "program_html")
REFERENCE_ANSWER_KEYS = ("exact_match", "must_include", "fuzzy_match", "must_exclude", "required_values", "one_of")
REQUIRED_CONTENT_KEYS = ("exact_match", "must_include", "must_exclude", "required_values", "fuzzy_match")
_PLACEHOLDER_RE = re.compile(r"__(?:SHOPPING_ADMIN|SHOPPING|REDDIT|GITLAB|MAP|WIKIPEDIA|HOMEPAGE)__")


class TaskFileError(ValueError):
    """A task file or task object is malformed; the message names the file, the task and the field."""


def default_site_urls(host: str = "localhost") -> dict[str, str]:
    return {site: f"http://{host}{port}" for site, port in DEFAULT_PORTS.items()}


def resolve_site_urls(urls: dict[str, str] | None = None, host: str = "localhost") -> dict[str, str]:
    """Given URLs (e.g. ``cfg.sites.urls``) over WebArena defaults; trailing "/" removed."""
    unknown = sorted(set(urls or {}) - set(DEFAULT_PORTS))
    if unknown:
        raise ValueError(f"unknown site(s) {unknown} in site URLs; allowed: {list(DEFAULT_PORTS)}")
    return {site: u.rstrip("/") for site, u in {**default_site_urls(host), **(urls or {})}.items()}


# ---------------------------------------------------------------------------------------------
# validation

def _type_name(v: Any) -> str:
    return "null" if v is None else type(v).__name__


def _is_str_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _check_func(expr: str, field: str, errs: list[str]) -> None:
    try:
        parse_helper_call(expr)
    except ValueError as e:
        errs.append(f"field '{field}': {e}")


def _eval_errors(ev: Any, errs: list[str]) -> None:
    if not isinstance(ev, dict):
        errs.append(f"field 'eval': expected an object, got {_type_name(ev)}")
        return
    types = ev.get("eval_types")
    if not _is_str_list(types) or not types:
        errs.append(f"field 'eval.eval_types': expected a non-empty list of str, got {types!r}")
        types = []
    for t in types:
        if t not in EVAL_TYPES:
            errs.append(f"field 'eval.eval_types': unknown eval type {t!r}; allowed: {list(EVAL_TYPES)}")

    ra = ev.get("reference_answers")
    if ra is not None and not isinstance(ra, dict):
        errs.append(f"field 'eval.reference_answers': expected an object or null, got {_type_name(ra)}")
        ra = None
    if "string_match" in types and not ra:
        errs.append("field 'eval.reference_answers': string_match needs a non-empty reference_answers object")
    for k, v in (ra or {}).items():
        f = f"eval.reference_answers.{k}"
        if k not in REFERENCE_ANSWER_KEYS:
            errs.append(f"field '{f}': unknown key; allowed: {list(REFERENCE_ANSWER_KEYS)}")
        elif k == "exact_match" and not isinstance(v, str):
            errs.append(f"field '{f}': expected str, got {_type_name(v)}")
        elif k == "must_include" and isinstance(v, str):
            pass  # one Lite task (#81) stores a bare string; the evaluator reads it as a one-item list
        elif k == "fuzzy_match" and not (v == "N/A" or _is_str_list(v)):
            errs.append(f"field '{f}': expected a list of str or \"N/A\", got {v!r}")
        elif k not in ("exact_match", "fuzzy_match") and not _is_str_list(v):
            errs.append(f"field '{f}': expected a list of str, got {v!r}")
    if (ra or {}).get("fuzzy_match") == "N/A" and not isinstance(ev.get("string_note"), str):
        errs.append("field 'eval.string_note': fuzzy_match \"N/A\" needs a string_note (the reason) as str")

    ru = ev.get("reference_url")
    if ru is not None and not isinstance(ru, str):
        errs.append(f"field 'eval.reference_url': expected str or null, got {_type_name(ru)}")
    if "url_match" in types and not (isinstance(ru, str) and ru.strip()):
        errs.append("field 'eval.reference_url': url_match needs a non-empty reference_url")
    note = ev.get("url_note")
    if note not in (None, "") and note not in URL_RULES:
        errs.append(f"field 'eval.url_note': unknown rule {note!r}; allowed: {list(URL_RULES)}")
    for k in ("string_note", "reference_answer_raw_annotation"):
        if ev.get(k) is not None and not isinstance(ev[k], str):
            errs.append(f"field 'eval.{k}': expected str or null, got {_type_name(ev[k])}")

    ph = ev.get("program_html")
    if ph is None:
        ph = []
    if not isinstance(ph, list):
        errs.append(f"field 'eval.program_html': expected a list, got {_type_name(ph)}")
        ph = []
    if "program_html" in types and not ph:
        errs.append("field 'eval.program_html': program_html needs at least one target")
    for i, tgt in enumerate(ph):
        f = f"eval.program_html[{i}]"
        if not isinstance(tgt, dict):
            errs.append(f"field '{f}': expected an object, got {_type_name(tgt)}")
            continue
        for k in ("url", "locator"):
            if not isinstance(tgt.get(k), str):
                errs.append(f"field '{f}.{k}': expected str, got {_type_name(tgt.get(k))}")
        if isinstance(tgt.get("url"), str):
            if tgt["url"].startswith("func:"):
                _check_func(tgt["url"], f"{f}.url", errs)
            elif not tgt["url"].strip():
                errs.append(f"field '{f}.url': empty; use \"last\", a URL or func:helper(...)")
        loc = tgt.get("locator")
        if isinstance(loc, str) and loc.strip():
            if loc.startswith("func:"):
                _check_func(loc, f"{f}.locator", errs)
            elif not (loc.startswith("document.") or loc.startswith("[...document.")):
                errs.append(f"field '{f}.locator': {loc[:60]!r} is not '', 'document.…', '[...document.…' or 'func:…'")
        if "prep_actions" in tgt and not _is_str_list(tgt["prep_actions"]):
            errs.append(f"field '{f}.prep_actions': expected a list of str")
        rc = tgt.get("required_contents")
        if not isinstance(rc, dict) or not rc:
            errs.append(f"field '{f}.required_contents': expected a non-empty object, got {rc!r}")
            continue
        for k, v in rc.items():
            ff = f"{f}.required_contents.{k}"
            if k not in REQUIRED_CONTENT_KEYS:
                errs.append(f"field '{ff}': unknown key; allowed: {list(REQUIRED_CONTENT_KEYS)}")
            elif k == "exact_match" and not isinstance(v, str):
                errs.append(f"field '{ff}': expected str, got {_type_name(v)}")
            elif k != "exact_match" and not _is_str_list(v):
                errs.append(f"field '{ff}': expected a list of str, got {v!r}")


def task_errors(task: Any) -> list[str]:
    """Every problem of one task object, as "field 'x': ..." strings (empty list = valid)."""
    if not isinstance(task, dict):
        return [f"expected a task object, got {_type_name(task)}"]
    errs = [f"field '{k}': missing" for k in TASK_KEYS if k not in task]
    errs += [f"field '{k}': unknown key; allowed: {list(TASK_KEYS)}" for k in task if k not in TASK_KEYS]

    def check(key, ok, want):
        if key in task and not ok(task[key]):
            errs.append(f"field '{key}': expected {want}, got {_type_name(task[key])} {task[key]!r:.80}")

    is_id = lambda v: isinstance(v, (int, str)) and not isinstance(v, bool)  # noqa: E731
    check("sites", lambda v: _is_str_list(v) and len(v) > 0, "a non-empty list of site names")
    if _is_str_list(task.get("sites")):
        for s in task["sites"]:
            if s not in TASK_CONFIG_SITES:
                errs.append(f"field 'sites': unknown site {s!r}; allowed: {list(TASK_CONFIG_SITES)}")
    check("task_id", is_id, "int or str")
    check("old_task_id", lambda v: v is None or is_id(v), "int, str or null")
    check("require_login", lambda v: isinstance(v, bool), "bool")
    check("require_reset", lambda v: isinstance(v, bool), "bool")
    check("storage_state", lambda v: v is None or isinstance(v, str), "str or null")
    check("start_url", lambda v: isinstance(v, str) and v.strip() != "", "a non-empty str")
    check("geolocation", lambda v: v is None or isinstance(v, dict), "null or an object")
    check("intent_template", lambda v: isinstance(v, str), "str")
    check("instantiation_dict", lambda v: isinstance(v, dict), "an object")
    check("intent", lambda v: isinstance(v, str) and v.strip() != "", "a non-empty str")
    check("intent_template_id", lambda v: isinstance(v, int) and not isinstance(v, bool), "int")
    if isinstance(task.get("start_url"), str):
        for j, tab in enumerate(task["start_url"].split(AND_SEP)):
            if not tab.strip():
                errs.append(f"field 'start_url': tab {j} of {task['start_url']!r} is empty")
    if "eval" in task:
        _eval_errors(task["eval"], errs)
    return errs


def validate_tasks(tasks: Any, source: str = "<tasks>") -> list[dict]:
    """Raise TaskFileError listing every malformed task (file, index, task_id, field); return the list."""
    if not isinstance(tasks, list):
        raise TaskFileError(f"{source}: expected a JSON list of task objects, got {_type_name(tasks)}")
    lines = []
    for i, t in enumerate(tasks):
        tid = t.get("task_id") if isinstance(t, dict) else None
        lines += [f"{source}: task #{i} (task_id={tid!r}): {e}" for e in task_errors(t)]
    ids = Counter(t.get("task_id") for t in tasks if isinstance(t, dict) and "task_id" in t)
    lines += [f"{source}: task_id {k!r} appears {n} times" for k, n in ids.items() if n > 1]
    if lines:
        more = f"\n... and {len(lines) - 30} more" if len(lines) > 30 else ""
        raise TaskFileError(f"{len(lines)} problem(s) in {source}:\n" + "\n".join(lines[:30]) + more)
    return tasks


def read_task_file(path: str | Path) -> list[dict]:
    """Read and validate a task file: a JSON list of tasks, or one task object (an exported <idx>.json)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TaskFileError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise TaskFileError(f"{path}: is a folder; expected a JSON task file (a list of tasks or one task)") from None
    except OSError as e:
        raise TaskFileError(f"{path}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise TaskFileError(f"{path}: not UTF-8 text (byte {e.start}); expected a JSON task file") from None
    except json.JSONDecodeError as e:
        raise TaskFileError(f"{path}: not valid JSON: {e}") from None
    if data == []:
        raise TaskFileError(f"{path}: the task list is empty (no tasks to run); expected a JSON list of task objects")
    return validate_tasks([data] if isinstance(data, dict) else data, str(path))


# ---------------------------------------------------------------------------------------------
# placeholders and export

def substitute_placeholders(obj: Any, urls: dict[str, str]) -> Any:
    """Replace site placeholders in every string of ``obj`` (dicts, lists, nested) with ``urls[site]``."""
    if isinstance(obj, str):
        def repl(m: re.Match) -> str:
            site = PLACEHOLDERS[m.group(0)]
            if site not in urls:
                raise ValueError(f"no URL for site {site!r} (placeholder {m.group(0)}); given: {sorted(urls)}")
            return urls[site].rstrip("/")
        return _PLACEHOLDER_RE.sub(repl, obj)
    if isinstance(obj, list):
        return [substitute_placeholders(x, urls) for x in obj]
    if isinstance(obj, dict):
        return {k: substitute_placeholders(v, urls) for k, v in obj.items()}
    return obj


def start_urls(task: dict) -> list[str]:
    """The tabs a task opens (`` |AND| `` separated start_url)."""
    return [u.strip() for u in task["start_url"].split(AND_SEP)]


def placeholder_sites(obj: Any) -> set[str]:
    """Sites whose placeholder (``__GITLAB__`` ...) occurs in any string of ``obj``."""
    if isinstance(obj, str):
        return {PLACEHOLDERS[m] for m in _PLACEHOLDER_RE.findall(obj)}
    if isinstance(obj, list):
        return set().union(*(placeholder_sites(x) for x in obj)) if obj else set()
    if isinstance(obj, dict):
        return set().union(*(placeholder_sites(v) for v in obj.values())) if obj else set()
    return set()


def needed_sites(task: dict) -> set[str]:
    return placeholder_sites(task) | {s for s in task.get("sites") or [] if s in PLACEHOLDERS.values()}


def unserved_sites(tasks: list[dict], served: Iterable[str], source: str = "<tasks>") -> list[str]:
    """One line per task that needs a site (by its placeholders or its ``sites`` list) outside ``served``."""
    served = set(served)
    lines = []
    for i, t in enumerate(tasks):
        missing = sorted(needed_sites(t) - served)
        if missing:
            phs = ", ".join(SITE_PLACEHOLDER[s] for s in missing)
            lines.append(f"{source}: task #{i} (task_id={t.get('task_id')!r}) needs site(s) {missing} ({phs})")
    return lines


def load_webarena_tasks(raw_path: str | Path, urls: dict[str, str] | None = None, missing: str = "default"
                        ) -> list[dict]:
    """Validated tasks with placeholders replaced by site URLs.

    ``missing`` says what happens to a placeholder whose site is not in ``urls``: ``default`` WebArena's default
    port on localhost (``resolve_site_urls``; what ``tasks export-webarena`` does), ``keep`` leave it for the
    environment's site hooks to substitute (the embedded sites), ``error`` a :class:`TaskFileError` naming the
    task, the placeholder and how to give the URL."""
    tasks = read_task_file(raw_path)
    if missing == "default":
        return substitute_placeholders(tasks, resolve_site_urls(urls))
    if missing not in ("keep", "error"):
        raise ValueError(f"missing={missing!r}; allowed: 'default', 'keep', 'error'")
    given = {s: u.rstrip("/") for s, u in (urls or {}).items()}
    resolve_site_urls(given)  # unknown site names fail here
    if missing == "error":
        lines = unserved_sites(tasks, given, str(raw_path))
        if lines:
            more = f"\n... and {len(lines) - 10} more" if len(lines) > 10 else ""
            need = sorted(set().union(*(needed_sites(t) for t in tasks)) - set(given))
            raise TaskFileError(
                f"{len(lines)} task(s) of {raw_path} need a site URL that is not configured:\n" + "\n".join(lines[:10])
                + more + "\nset " + ", ".join(f"{s.upper()}=<url>" for s in need)
                + " (or sites.urls." + need[0] + " in the config)")
    return [_substitute_given(t, given) for t in tasks]


def _substitute_given(obj: Any, urls: dict[str, str]) -> Any:
    """``substitute_placeholders`` for the sites in ``urls`` only; other placeholders stay."""
    if isinstance(obj, str):
        return _PLACEHOLDER_RE.sub(lambda m: urls.get(PLACEHOLDERS[m.group(0)], m.group(0)), obj)
    if isinstance(obj, list):
        return [_substitute_given(x, urls) for x in obj]
    if isinstance(obj, dict):
        return {k: _substitute_given(v, urls) for k, v in obj.items()}
    return obj


def export_webarena(raw_path: str | Path, out_dir: str | Path, urls: dict[str, str] | None = None) -> Path:
    """Write ``<out>/<name>.json`` and ``<out>/<name>/<idx>.json``; return the per-task folder."""
    raw_path, out_dir = Path(raw_path), Path(out_dir)
    tasks = load_webarena_tasks(raw_path, urls)
    name = raw_path.name.removesuffix(".json").removesuffix(".raw")
    per_task = out_dir / name
    per_task.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(tasks, indent=2) + "\n")
    for idx, task in enumerate(tasks):
        (per_task / f"{idx}.json").write_text(json.dumps(task, indent=2) + "\n")
    return per_task


def summarize(tasks: list[dict]) -> dict[str, Counter]:
    """Counts per site tuple, per site (a task counts once per site) and per eval-type combination."""
    return {"site_tuples": Counter("+".join(t["sites"]) for t in tasks),
            "sites": Counter(s for t in tasks for s in t["sites"]),
            "eval_types": Counter("+".join(t["eval"]["eval_types"]) for t in tasks)}


# ---------------------------------------------------------------------------------------------
# generated tasks

def make_generated_task_config(task_id: int | str, site: str, intent: str, start_path: str = "",
                               auth_dir: str = "./.auth", old_task_id: int | str | None = None) -> dict:
    """Runnable config of an LLM-generated task (official README template). It keeps placeholders: substitute site
    URLs when it is run. ``storage_state`` is null for map/wikipedia, which need no login (as in WebArena-Lite)."""
    if site not in TASK_CONFIG_SITES or site == "wikipedia":
        raise ValueError(f"site {site!r} cannot start a generated task; allowed: {list(SITES)}")
    if not isinstance(intent, str) or not intent.strip():
        raise ValueError(f"task {task_id!r}: intent must be a non-empty str")
    path = start_path if not start_path or start_path.startswith("/") else "/" + start_path
    task = {
        "sites": [site], "task_id": task_id, "old_task_id": old_task_id, "require_login": True,
        "storage_state": None if site == "map" else f"{auth_dir.rstrip('/')}/{site}_state.json",
        "start_url": SITE_PLACEHOLDER[site] + path, "geolocation": None, "intent_template": "",
        "instantiation_dict": {}, "intent": intent.strip(), "require_reset": False,
        "eval": {"eval_types": ["string_match"], "reference_answers": {"exact_match": "N/A"}, "reference_url": "",
                 "program_html": [], "string_note": "", "reference_answer_raw_annotation": ""},
        "intent_template_id": 0,
    }
    errs = task_errors(task)
    if errs:  # cannot happen for valid arguments; guards the template against edits
        raise TaskFileError(f"generated task {task_id!r}: " + "; ".join(errs))
    return task


def to_task_row(task: dict, phase: int, origin: str, parent_task_id: str | None = None,
                family: str | None = None) -> dict:
    """A row for ``TrajectoryStore.write_tasks`` (the shared task-row contract)."""
    return {"task_id": str(task["task_id"]), "phase": phase, "site": task["sites"][0],
            "sites": json.dumps(task["sites"]), "intent": task["intent"], "start_url": task["start_url"],
            "eval_json": json.dumps(task["eval"]), "origin": origin, "parent_task_id": parent_task_id,
            "family": family, "config_json": json.dumps(task)}
