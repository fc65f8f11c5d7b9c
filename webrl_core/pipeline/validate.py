"""Checks of a run's inputs before any work starts, so bad input fails in seconds with one message that names the
file, the field or the value, and before anything is written.

``preflight(settings, run_dir, ...)`` runs the checks a flow needs (the CLI calls it before starting Prefect, the
flows call it first thing, so deployments get them too); each check also stands alone:

* ``check_run_dir``: the run dir can be created and written (a path under a file, a read-only disk), and was not
  made by another config: a ``config.yaml`` with another ``run.name`` is refused (phase k would build on models
  of another run, and the run's links and tables would mix both), other changed fields are listed as warnings.
* ``record_config``: writes ``config.yaml`` atomically; a different earlier one is kept in ``config-history/``
  (never overwritten silently), so every result in the run dir can be traced to the config that made it.
* ``check_task_file`` / ``check_test_set``: a task file (``eval.test_set``, ``curriculum.seed_tasks``) is valid JSON
  with valid tasks, not empty, and every site its tasks need is served (embedded sites, or a URL in ``sites.urls`` /
  SHOPPING, ...).
* ``check_phase_count``: ``webrl train`` / ``ablate`` run at least one phase after the bootstrap.
* ``check_model``: a model folder has config.json of a known causal LM, complete weights and a tokenizer.
* ``check_policy_endpoint``: an OpenAI-compatible endpoint answers ``GET /models`` with the configured model and
  a 1-token completion in the OpenAI shape (not an HTML page, not another API).
* ``check_phase_inputs``: phase k >= 1 finds phase k-1's actor and critic and the ORM.
* ``check_store``: the run's store opens (schema version) and every Parquet file of it is readable.

Every failure is a ``BadInputError`` (a ``ValueError``); ``webrl`` prints it without a traceback.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from webrl_core.config import WebRLSettings
from webrl_core.config_loader import dump_config
from webrl_core.errors import BadInput, MissingInput
from webrl_core.websites import SITES

CONFIG_FILE = "config.yaml"
HISTORY_DIR = "config-history"


class BadInputError(BadInput):
    """Bad user input found before work starts; the message names the file, the field or the value."""


class InputMissing(BadInputError, MissingInput):
    """A file or folder a run needs does not exist; the message names it and, where there is one, the command that
    makes it."""


# ------------------------------------------------------------------------------------------------ run dir
def _first_existing(p: Path) -> Path:
    while not p.exists() and p.parent != p:
        p = p.parent
    return p


def _probe(d: Path) -> None:
    fd, probe = tempfile.mkstemp(prefix=".webrl-probe-", dir=d)
    try:
        os.write(fd, b"webrl")
        os.fsync(fd)
    finally:
        os.close(fd)
        os.unlink(probe)


def check_writable(run_dir: str | os.PathLike) -> Path:
    """The run dir can be written: a probe file is written, fsynced and removed in it and in its store/ (or, when
    it does not exist yet, in the nearest existing parent, so a failed check creates nothing). Fails naming the
    path and the reason: a path under a file, a read-only disk, no space, no permission."""
    rd = Path(os.path.expanduser(str(run_dir))).absolute()
    anc = _first_existing(rd)
    if anc != rd and not anc.is_dir():
        raise BadInputError(f"run dir {rd}: {anc} is a file, not a folder; choose another --run-dir (or run.root)")
    if rd.exists() and not rd.is_dir():
        raise BadInputError(f"run dir {rd} is a file, not a folder; choose another --run-dir (or run.root)")
    for d in ([rd, rd / "store"] if rd.exists() else [anc]):
        if not d.is_dir():
            continue
        try:
            _probe(d)
        except OSError as e:
            what = f"cannot write in {d}" if d != anc or rd.exists() else f"cannot create it in {d}"
            raise BadInputError(
                f"run dir {rd}: {what} ({e.strerror or e}); results could not be stored. Use a writable --run-dir "
                f"(or run.root)" + (f"; reading works: webrl store stats {rd}" if rd.exists() else "")) from None
    return rd


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d}


def config_changes(old: dict, new: dict) -> list[str]:
    """``field: old -> new`` for every leaf that differs."""
    a, b = _flat(old), _flat(new)
    return [f"{k}: {a.get(k, '<unset>')!r} -> {b.get(k, '<unset>')!r}" for k in sorted(set(a) | set(b))
            if a.get(k, "<unset>") != b.get(k, "<unset>")]


def _previous_config(rd: Path) -> dict | None:
    import yaml

    f = rd / CONFIG_FILE
    if not f.is_file():
        return None
    try:
        data = yaml.safe_load(f.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError, OSError) as e:
        raise BadInputError(f"{f}: the run dir's recorded config is unreadable ({e}); move it aside to go on") from None
    if not isinstance(data, dict):
        raise BadInputError(f"{f}: the run dir's recorded config is not a mapping; move it aside to go on")
    return data


def check_run_dir(run_dir: str | os.PathLike, settings: WebRLSettings) -> list[str]:
    """Writable (``check_writable``) and made by this config. Returns warnings (changed fields); raises when the
    run dir's ``config.yaml`` has another ``run.name``: that run dir belongs to another config."""
    rd = check_writable(run_dir)
    old = _previous_config(rd)
    if old is None:
        return []
    new = settings.model_dump(mode="json")
    old_name = (old.get("run") or {}).get("name")
    if old_name is not None and old_name != settings.run.name:
        raise BadInputError(
            f"run dir {rd} belongs to another config: its {CONFIG_FILE} has run.name={old_name!r}, this config "
            f"run.name={settings.run.name!r}. Its models, evaluations and tables would mix both. Use a fresh "
            f"--run-dir, or --set run.name={old_name} to continue that run on purpose")
    changes = config_changes(old, new)
    if not changes:
        return []
    more = f" (+{len(changes) - 8} more)" if len(changes) > 8 else ""
    warnings = [f"run dir {rd} was last run with a different config; changed: " + "; ".join(changes[:8]) + more
                + f". Stored results are reused only for identical inputs; the earlier config is kept in "
                f"{rd / HISTORY_DIR}/"]
    was_seeded = (old.get("policy") or {}).get("seeded", "<unset>")  # as config_changes names a missing field
    if settings.policy.seeded and was_seeded is not True:
        # a fork of a run made before per-action seeds: its sampled episodes are keyed without them
        warnings.append(f"run dir {rd}: its sampled (temperature > 0) episodes were made without per-action seeds "
                        f"(policy.seeded was {was_seeded!r}); with policy.seeded=true every one is rolled out anew "
                        f"under a new id. --set policy.seeded=false reuses them")
    return warnings


def record_config(run_dir: str | os.PathLike, settings: WebRLSettings) -> Path | None:
    """Write ``config.yaml`` atomically. An earlier, different one is first copied to
    ``config-history/<utc time of its last write>-<sha256[:12]>.yaml``; returns that copy (None if no change)."""
    rd = Path(run_dir)
    rd.mkdir(parents=True, exist_ok=True)
    f = rd / CONFIG_FILE
    text = dump_config(settings)
    kept = None
    if f.is_file():
        old = f.read_bytes()
        if old == text.encode():
            return None
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(f.stat().st_mtime))
        kept = rd / HISTORY_DIR / f"{stamp}-{hashlib.sha256(old).hexdigest()[:12]}.yaml"
        kept.parent.mkdir(exist_ok=True)
        if not kept.exists():
            tmp = kept.with_suffix(".tmp")
            tmp.write_bytes(old)
            os.replace(tmp, kept)
    tmp = f.with_suffix(".yaml.tmp")
    tmp.write_text(text)
    os.replace(tmp, f)
    return kept


# ------------------------------------------------------------------------------------------------ test set
def check_test_set(tasks: list, source: str) -> list:
    """The test set has tasks (after ``eval.max_tasks``)."""
    if not tasks:
        raise BadInputError(f"{source}: the test set is empty (0 tasks); nothing would be evaluated and the "
                            f"success rate would read 0%. Give a task file with tasks (eval.test_set)")
    return tasks


def served_sites(settings: WebRLSettings) -> set[str]:
    """Sites a rollout can reach: the embedded ones (embedded mode; their hooks substitute the placeholders) or
    the configured URLs (webarena mode)."""
    if settings.sites.mode == "embedded":
        return set(SITES)
    return set(settings.sites.urls)


def check_task_file(settings: WebRLSettings, field: str = "eval.test_set") -> list[dict] | None:
    """Read and validate the task file a config field names (``eval.test_set``, ``curriculum.seed_tasks``; None when
    it names none, or the embedded test set): exists, valid tasks, not empty, every site its tasks need is served.
    Returns the raw tasks (placeholders kept)."""
    from webrl_core.env.webarena import TaskFileError, needed_sites, read_task_file, site_url_hint, unserved_sites

    section, key = field.split(".")
    src = getattr(getattr(settings, section), key)
    if src in (None, "", "embedded"):
        return None
    p = Path(os.path.expanduser(src))
    if not p.exists():
        from webrl_core.env.webarena import WEBARENA_LITE_FILE

        hint = (f"; `webrl tasks fetch-webarena-lite` writes the official {WEBARENA_LITE_FILE} here"
                if p.name == WEBARENA_LITE_FILE else "")
        expected = "'embedded' or a WebArena-Lite" if field == "eval.test_set" else "a WebArena-Lite"
        raise InputMissing(f"{field}: no file {src!r} (from {Path.cwd()}); expected {expected} task JSON file{hint}")
    try:
        tasks = read_task_file(p)  # TaskFileError names the file, the task and the field
    except TaskFileError as e:
        raise type(e)(f"{field}: {e}") from None  # and the config field that named the file
    if field == "eval.test_set":
        check_test_set(tasks, f"eval.test_set {src}")
    elif not tasks:
        raise BadInputError(f"{field} {src}: the file has no tasks; give a task file with tasks")
    lines = unserved_sites(tasks, served_sites(settings), src)
    if lines:
        if settings.sites.mode == "embedded":
            how = (f"the embedded sites serve {list(SITES)} only: use sites.mode=webarena with a URL for "
                   f"every site (SHOPPING=..., WIKIPEDIA=... or sites.urls), or drop those tasks")
        else:
            how = site_url_hint(set().union(*(needed_sites(t) for t in tasks)) - served_sites(settings))
        more = f"\n... and {len(lines) - 10} more" if len(lines) > 10 else ""
        raise BadInputError(f"{len(lines)} task(s) of {field} {src} need a site that is not served "
                            f"(sites.mode={settings.sites.mode}):\n" + "\n".join(lines[:10]) + more + "\n" + how)
    return tasks


# ------------------------------------------------------------------------------------------------ models, policy
def check_model(path: str | os.PathLike | None, field: str) -> None:
    """A usable HF causal-LM folder (``models.check_model_folder``); None/"" passes (nothing configured)."""
    if path in (None, ""):
        return
    from webrl_core.learn.model_folder import check_model_folder

    check_model_folder(path, "model", field=field)


def check_policy_endpoint(settings: WebRLSettings, timeout_s: float = 10.0) -> str:
    """For ``policy.backend=openai``: the endpoint serves ``policy.model_name`` and answers a 1-token request in
    the OpenAI shape. Returns what it reports serving (``served_model_digest``)."""
    import httpx

    from webrl_core.agent.policy import served_model_digest

    pc = settings.policy
    if not pc.base_url or "://" not in pc.base_url:
        raise BadInputError(f"policy.base_url={pc.base_url!r} is not a URL like http://127.0.0.1:8000/v1 "
                            f"(policy.backend=openai needs it)")
    if not pc.model_name:
        raise BadInputError("policy.model_name is empty; policy.backend=openai needs the served model's name")
    try:
        served = served_model_digest(pc.base_url, pc.model_name, pc.api_key_env, timeout_s=timeout_s)
    except RuntimeError as e:
        hint = (" Is the server running at policy.base_url (e.g. `vllm serve <model> --port 8000`, then "
                "policy.base_url=http://127.0.0.1:8000/v1)?" if "did not answer" in str(e) else
                " Set policy.model_name to one of those.")
        raise BadInputError(f"{e}.{hint}") from None
    chat = settings.prompt.style == "chat"
    path = "/chat/completions" if chat else "/completions"
    body: dict[str, Any] = {"model": pc.model_name, "max_tokens": 1, "temperature": 0}
    body.update({"messages": [{"role": "user", "content": "ok"}]} if chat else {"prompt": "ok"})
    url = pc.base_url.rstrip("/") + path
    headers = {"Authorization": f"Bearer {os.environ.get(pc.api_key_env, 'EMPTY')}"}
    try:
        r = httpx.post(url, json=body, headers=headers, timeout=max(timeout_s, 30.0))
    except httpx.HTTPError as e:
        raise BadInputError(f"policy endpoint: POST {url} failed: {type(e).__name__}: {e}") from None
    if r.status_code >= 400:
        raise BadInputError(f"policy endpoint: POST {url} answered HTTP {r.status_code}: {r.text[:200]!r}")
    try:
        choice = r.json()["choices"][0]
        text = choice["message"]["content"] if chat else choice["text"]
        if not isinstance(text, str):
            raise TypeError(f"the text is {type(text).__name__}")
    except (ValueError, KeyError, IndexError, TypeError) as e:
        want = "choices[0].message.content" if chat else "choices[0].text"
        raise BadInputError(f"policy endpoint: POST {url} answered {r.text[:200]!r}, not an OpenAI "
                            f"{'chat ' if chat else ''}completion ({want} missing: {type(e).__name__}: {e}); "
                            f"is policy.base_url an OpenAI-compatible server?") from None
    return served


# ------------------------------------------------------------------------------------------------ phases, store
def check_phase_count(phases: int | None, flag: str = "--phases") -> None:
    """A number of phases to run after the bootstrap is at least 1 (None: the config's ``run.phases``)."""
    if phases is not None and phases < 1:
        raise BadInputError(f"{flag} {phases}: the number of WebRL phases after the bootstrap must be >= 1; phase 0 "
                            f"alone is `webrl bootstrap`")


def check_phase_inputs(run_dir: str | os.PathLike, phase: int, settings: WebRLSettings) -> None:
    """Phase k >= 1 needs phase k-1's actor and critic, and the ORM (phase 0's or models.orm)."""
    rd = Path(run_dir)
    if phase < 1:
        raise BadInputError(f"--phase {phase}: phases start at 1; phase 0 is the bootstrap (`webrl bootstrap "
                            f"--run-dir {rd}`, or `webrl train`, which runs it when needed)")
    need = [(rd / "models" / f"phase={phase - 1}" / n) for n in ("actor", "critic")]
    if not settings.models.orm:
        need.append(rd / "models" / "phase=0" / "orm")
    missing = [p for p in need if not p.exists()]
    if missing:
        prev = ("the bootstrap: `webrl bootstrap" if phase == 1 else f"phase {phase - 1} first: `webrl phase "
                f"--phase {phase - 1}")
        raise InputMissing(f"phase {phase} needs {', '.join(str(p) for p in missing)}, which do(es) not exist; "
                           f"run {prev} --config <this config> --run-dir {rd}` (or `webrl train`, which runs "
                           f"every phase in order)")


def check_store(run_dir: str | os.PathLike) -> None:
    """The store (if any) opens and every Parquet file in it is readable (footers; ``StoreError`` otherwise)."""
    from webrl_core.runs.store import StoreError, TrajectoryStore, damaged_files_error

    root = Path(run_dir) / "store"
    if not root.is_dir():
        return
    TrajectoryStore(run_dir)  # schema version
    err = damaged_files_error(root, StoreError("footer check"))
    if err is not None:
        raise err


def check_real_path(settings: WebRLSettings, flow: str) -> None:
    """A real model's phase 0 (``bootstrap.sft_data`` or ``bootstrap.sft_actor``) names what it needs: the base model
    to fine-tune, the ORM, and one of the two sources only; a managed serving engine's interpreter exists."""
    boot, models = settings.bootstrap, settings.models
    if boot.sft_data and boot.sft_actor:
        raise BadInputError(f"bootstrap.sft_data={boot.sft_data!r} and bootstrap.sft_actor={boot.sft_actor!r} are "
                            f"both set: fine-tune models.actor on the data, or start from the SFT checkpoint, not both")
    if boot.sft_data and not models.actor:
        raise BadInputError("bootstrap.sft_data is set: models.actor must name the base model's HF folder to "
                            "fine-tune on it")
    if boot.sft_data:  # read as the SFT stage will: a broken file fails now, not after the run dir is made
        from webrl_core.learn.sft_data import DemonstrationError, read_demonstrations

        try:
            read_demonstrations(boot.sft_data, settings.prompt.compat)
        except DemonstrationError as e:
            raise type(e)(f"bootstrap.sft_data: {e}") from None
    if settings.bootstrap_from_checkpoints() and not models.orm and flow in ("bootstrap", "phase", "train"):
        raise BadInputError("a real model's phase 0 (bootstrap.sft_data / bootstrap.sft_actor) trains no ORM: "
                            "models.orm must name the ORM's HF folder")
    sv = settings.serving
    if settings.policy.backend != "openai" or sv.engine == "external":
        return
    if sv.python and not (Path(sv.python).is_file() and os.access(sv.python, os.X_OK)):
        raise BadInputError(f"serving.python={sv.python!r} is not an executable file (for vLLM: bash "
                            f"infra/setup_vllm.sh, then serving.python=.venv-vllm/bin/python)")
    module = {"vllm": "vllm", "sglang": "sglang"}.get(sv.engine)
    if module and not sv.command and not sv.python and importlib.util.find_spec(module) is None:
        raise BadInputError(f"serving.engine={sv.engine}: {module} is not installed in this environment; install it "
                            f"in its own (bash infra/setup_vllm.sh for vLLM) and set serving.python to its "
                            f"interpreter (e.g. .venv-vllm/bin/python)")


def preflight(settings: WebRLSettings, run_dir: str | os.PathLike, *, model: str | None = None,
              phase: int | None = None, flow: str = "eval") -> list[str]:
    """Every check a flow needs, cheapest first; returns warnings to log (raises on bad input).
    ``flow``: bootstrap | phase | train | eval; ``model``: the checkpoint ``webrl eval`` evaluates."""
    if flow == "phase":
        check_phase_inputs(run_dir, phase if phase is not None else 1, settings)
    warnings = check_run_dir(run_dir, settings)
    check_task_file(settings, "eval.test_set")
    check_task_file(settings, "curriculum.seed_tasks")
    check_store(run_dir)
    check_real_path(settings, flow)
    if settings.policy.backend == "openai" and (settings.serving.engine == "external" or (flow == "eval" and not model)):
        check_policy_endpoint(settings)  # a managed engine is started (and checked) by the rollout itself
    # last: the architecture check imports transformers (seconds; the flow imports it anyway)
    if model and settings.policy.backend == "hf":
        check_model(model, "--model")
    check_model(settings.models.actor, "models.actor")
    check_model(settings.models.orm, "models.orm")
    check_model(settings.bootstrap.sft_actor, "bootstrap.sft_actor")
    return warnings
