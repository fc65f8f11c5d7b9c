"""The stages of WebRL's phase loop (webrl_spec.md §1, Algorithm 1), as plain functions.

Each stage takes the resolved settings, the run directory, the phase and content-addressed references
(``ArtifactRef``) to its inputs, writes its outputs under the run directory, and returns references to
them (plus small metrics). ``tasks/`` wraps each one as a cached Prefect task; nothing here imports Prefect.

Phase 0 (bootstrap, embedded default): oracle demonstrations -> tokenizer -> SFT actor -> SFT rollouts
(+ random-policy rollouts) labelled by the sites' evaluators -> ORM training -> critic initialisation.
Phase k >= 1: generate tasks from phase k-1's failures -> critic filter -> materialise -> rollouts ->
ORM labels -> transitions -> perplexity replay -> critic update -> actor update (reference = actor k-1)
-> evaluation on the held-out test set.

Run directory layout: ``tasks/phase=k/*.json``, ``data/phase=k/*``, ``models/phase=k/{actor,critic,orm}``,
``store/``, ``eval/phase=k.json``, ``mlflow.db``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import time
from pathlib import Path
from typing import Any, Iterator

from webrl_core import identity, validate
from webrl_core.artifacts import ArtifactRef, read_json, write_json
from webrl_core.config import WebRLSettings
from webrl_core.store import TrajectoryStore
from webrl_core.websites import is_success



# ----------------------------------------------------------------------------------------- plumbing
def output_key(settings: WebRLSettings, *inputs: Any) -> str:
    """Key of a stage's output: its settings and its inputs (artifact refs by content)."""
    import hashlib

    blob = json.dumps([settings.model_dump(mode="json"), [getattr(i, "sha256", i) for i in inputs]],
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def versioned(path: Path, key: str) -> Path:
    """Where to write an output: ``<dir>/.versions/<name>@<key><ext>``; ``publish`` points ``path`` at it.

    Outputs of different inputs never overwrite each other, so a cached result (which references its own
    version) stays valid after a run with another knob value, while ``path`` names the latest one."""
    real = path.parent / ".versions" / f"{path.stem}@{key}{path.suffix}"
    real.parent.mkdir(parents=True, exist_ok=True)
    if real.is_dir():
        import shutil

        shutil.rmtree(real)  # a half-written folder of a killed run
    return real


def publish(path: Path, real: Path) -> Path:
    import os

    tmp = path.parent / f".{path.name}.link.tmp"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(os.path.relpath(real, path.parent), tmp)
    if path.exists() and not path.is_symlink() and path.is_dir():
        import shutil

        shutil.rmtree(path)
    os.replace(tmp, path)
    return real


def phase_dir(run_dir: str | Path, kind: str, phase: int) -> Path:
    p = Path(run_dir) / kind / f"phase={phase}"
    p.mkdir(parents=True, exist_ok=True)
    return p


@contextlib.contextmanager
def site_session(settings: WebRLSettings) -> Iterator[Any]:
    """Site hooks for the run: our embedded sites (started here) or real WebArena URLs."""
    if settings.sites.mode == "webarena":
        from webrl_core.env.browser import WebArenaHooks

        yield WebArenaHooks(settings.sites.urls, auth_dir=settings.sites.auth_dir)
        return
    from webrl_core.sites import EmbeddedSites

    sites = EmbeddedSites(data_seed=settings.sites.data_seed, host=settings.sites.host, workers=settings.sites.workers)
    sites.start()
    try:
        yield sites
    finally:
        sites.stop()


def policy_digest_for(settings: WebRLSettings, actor_ref: ArtifactRef | None, purpose: str) -> str:
    """The policy's identity in episode keys (``webrl_core.identity``): ``hf:<checkpoint sha256>``,
    ``openai:<model>@<served digest>``, ``oracle`` or ``random:s<seed>``."""
    backend = settings.policy.backend if purpose not in identity.SCRIPTED_POLICIES else purpose
    if backend == "oracle":
        return "oracle"
    if backend == "random":
        return f"random:s{settings.run.seed}"
    if backend == "openai":
        from webrl_core.policy import served_model_digest

        pc = settings.policy
        return f"openai:{pc.model_name}@{served_model_digest(pc.base_url, pc.model_name, pc.api_key_env)}"
    if actor_ref is None:
        raise ValueError(f"policy.backend=hf needs an actor checkpoint for the {purpose!r} rollout; none was given")
    return f"hf:{actor_ref.sha256}"


def rollout_identity(settings: WebRLSettings, actor_ref: ArtifactRef | None, temperature: float, purpose: str
                     ) -> dict[str, str]:
    """What acts in a rollout, as it enters the episode keys: the policy's identity and the digest of the
    sampling (model policies only) and env/site settings."""
    sites = {"mode": settings.sites.mode, "data_seed": settings.sites.data_seed, "urls": settings.sites.urls}
    sampled = purpose not in identity.SCRIPTED_POLICIES and settings.policy.backend not in identity.SCRIPTED_POLICIES
    return {"policy_digest": policy_digest_for(settings, actor_ref, purpose),
            "settings_digest": identity.settings_digest(settings.env, temperature=temperature if sampled else None,
                                                        policy_cfg=settings.policy, prompt_style=settings.prompt.style,
                                                        sites=sites)}


def phase_policy_digest(settings: WebRLSettings, run_dir: str | Path, phase: int) -> str:
    """Identity of the policy whose rollouts are phase ``phase``'s own experience in the current lineage: the
    SFT actor's bootstrap rollouts for phase 0, actor k-1's rollouts for phase k >= 1 (Algorithm 1). Episodes of
    the same phase by other policies (an earlier run before a knob changed an upstream model) are stale."""
    return policy_digest_for(settings, model_ref(run_dir, max(0, phase - 1), "actor"),
                             "bootstrap" if phase == 0 else "rollout")


def lineage(settings: WebRLSettings, run_dir: str | Path, before_phase: int) -> list[str]:
    """``"<phase>|<policy digest>"`` of the experience phases < ``before_phase`` contribute to replay: the oracle's
    demonstrations and each phase's rollouts by the policy of the current lineage."""
    out = ["0|oracle"]
    for k in range(before_phase):
        try:
            out.append(f"{k}|{phase_policy_digest(settings, run_dir, k)}")
        except FileNotFoundError:  # a real-model run without bootstrap rollouts has no phase-0 actor of its own
            continue
    return out


def make_policy(settings: WebRLSettings, actor_ref: ArtifactRef | None, temperature: float, purpose: str):
    """The action policy of a rollout: oracle/random (scripted), in-process HF model, or an OpenAI-compatible server."""
    backend = settings.policy.backend if purpose not in identity.SCRIPTED_POLICIES else purpose
    if backend == "oracle":
        from webrl_core.sites import OraclePolicy

        return OraclePolicy()
    if backend == "random":
        from webrl_core.env.scripted import RandomPolicy

        return RandomPolicy(seed=settings.run.seed)
    if backend == "openai":
        from webrl_core.policy import OpenAIPolicy

        return OpenAIPolicy(settings.policy.base_url, settings.policy.model_name, cfg=settings.policy,
                            temperature=temperature)
    from webrl_core.policy import HFPolicy

    actor_dir = actor_ref.path
    return HFPolicy(actor_dir, settings.policy, settings.models, temperature=temperature,
                    policy_id=f"{Path(actor_dir).parent.name}/{Path(actor_dir).name}@T{temperature:g}",
                    style=settings.prompt.style)


def stratified(tasks: list[dict], n: int | None) -> list[dict]:
    """Every k-th task per site so a subset keeps the per-site mix."""
    if n is None or n >= len(tasks):
        return tasks
    by_site: dict[str, list[dict]] = {}
    for t in tasks:
        by_site.setdefault(t["sites"][0], []).append(t)
    out: list[dict] = []
    i = 0
    while len(out) < n:
        for site in sorted(by_site):
            if i < len(by_site[site]) and len(out) < n:
                out.append(by_site[site][i])
        i += 1
    return out


# ----------------------------------------------------------------------------------------- task sets
def train_task_pool(settings: WebRLSettings, run_dir: str, n: int, seed_offset: int, name: str) -> ArtifactRef:
    """Sample n tasks from the embedded training families (deterministic from the run seed)."""
    from webrl_core.env.webarena import to_task_row
    from webrl_core.sites import train_tasks

    tasks = train_tasks(n, seed=settings.run.seed * 1000 + seed_offset, data_seed=settings.sites.data_seed)
    TrajectoryStore(run_dir).write_tasks(
        [to_task_row(t, 0, "train", family=t.get("family")) for t in tasks])
    return write_json(tasks, phase_dir(run_dir, "tasks", 0) / f"{name}.json")


def test_task_set(settings: WebRLSettings, run_dir: str) -> ArtifactRef:
    """The held-out test set: the embedded one, or a WebArena-Lite raw file with URLs substituted."""
    from webrl_core.env.webarena import to_task_row

    if settings.eval.test_set == "embedded":
        from webrl_core.sites import test_set

        tasks = test_set(data_seed=settings.sites.data_seed)
    else:
        from webrl_core.env.webarena import load_webarena_tasks

        if settings.sites.mode == "embedded":  # placeholders stay: the embedded sites fill them per episode
            tasks = load_webarena_tasks(settings.eval.test_set, {}, missing="keep")
        else:
            tasks = load_webarena_tasks(settings.eval.test_set, settings.sites.urls, missing="error")
    tasks = stratified(tasks, settings.eval.max_tasks)
    validate.check_test_set(tasks, f"eval.test_set {settings.eval.test_set}")
    TrajectoryStore(run_dir).write_tasks([to_task_row(t, 0, "test", family=t.get("family")) for t in tasks])
    return write_json(tasks, Path(run_dir) / "tasks" / "test.json")


# ----------------------------------------------------------------------------------------- rollouts
def rollout(settings: WebRLSettings, run_dir: str, phase: int, purpose: str, tasks_ref: ArtifactRef,
            actor_ref: ArtifactRef | None, temperature: float, shard: int = 0, n_shards: int = 1) -> dict:
    """Roll out a shard of a task set; every finished episode goes to the store as it ends.

    Resumable: an episode whose id (task content, policy identity, settings, seed, attempt; see
    ``webrl_core.identity``) is already stored without error is reused, so a killed rollout re-run loses at most
    the episodes that were in flight and duplicates nothing, while a changed policy or knob gets new episodes.
    Fails when more than ``env.max_error_rate`` of the shard's episodes errored (they stay stored)."""
    from webrl_core.env.rollout import plan_episode_ids, run_rollout

    tasks = read_json(tasks_ref)[shard::n_shards]
    store = TrajectoryStore(run_dir)
    seed = settings.run.seed
    ident = rollout_identity(settings, actor_ref, temperature, purpose)
    ids = plan_episode_ids(tasks, phase=phase, purpose=purpose, seed=seed, **ident)
    done = {e["episode_id"] for e in store.sql(
        "SELECT episode_id FROM episodes WHERE episode_id IN (SELECT unnest($ids)) AND status <> 'error'", {"ids": ids})}
    todo = [(t, a) for t, a, i in zip(tasks, default_attempts(tasks), ids) if i not in done]
    if todo and settings.rollout.engine == "ray":  # shards on a Ray cluster; the driver writes the store
        from webrl_core.ray_rollout import run_on_ray

        run_on_ray(settings, settings.rollout, run_dir, phase, purpose, [t for t, _ in todo], [a for _, a in todo],
                   actor_ref, temperature, ident)
    elif todo:
        policy = make_policy(settings, actor_ref, temperature, purpose)
        with site_session(settings) as hooks:
            run_rollout([t for t, _ in todo], policy, settings.env.n_envs, cfg=settings.env, hooks=hooks, store=store,
                        phase=phase, purpose=purpose, seed=seed, attempts=[a for _, a in todo], progress=True,
                        screenshot_dir=Path(run_dir) / "screenshots", **ident)
    rows = {e["episode_id"]: e for e in store.sql(
        "SELECT * FROM episodes WHERE episode_id IN (SELECT unnest($ids))", {"ids": ids})}
    missing = [i for i in ids if i not in rows]
    if missing:
        raise RuntimeError(f"rollout of {purpose} phase {phase} shard {shard}: {len(missing)} episode(s) were not "
                           f"stored, e.g. {missing[:3]}")
    got = [rows[i] for i in ids]
    out = {"episode_ids": ids, "n": len(got), "policy_digest": ident["policy_digest"],
           "env_success": sum(1 for e in got if e["status"] != "error" and is_success(e.get("env_score"))),
           "errors": sum(1 for e in got if e["status"] == "error"), "skipped_existing": len(tasks) - len(todo)}
    check_error_rate(settings.env.max_error_rate, f"rollout of {purpose} phase {phase} shard {shard}", got)
    return out


def check_error_rate(limit: float, what: str, episodes: list[dict]) -> None:
    """Fail a stage whose share of errored episodes exceeds ``limit``, naming the first errors."""
    errs = [e for e in episodes if e["status"] == "error"]
    if episodes and len(errs) / len(episodes) > limit:
        first = "\n".join(f"  {e['episode_id']}: {(e.get('error') or '').strip().splitlines()[0][:300] if e.get('error') else '?'}"
                          for e in errs[:3])
        raise RuntimeError(f"{what}: {len(errs)} of {len(episodes)} episodes errored ({len(errs) / len(episodes):.0%} > "
                           f"env.max_error_rate={limit:g}); the errored ones are stored and re-run on the next "
                           f"attempt. First errors:\n{first}")


def default_attempts(tasks: list[dict]) -> list[int]:
    from webrl_core.env.rollout import default_attempts as attempts

    return attempts(tasks)


def merge_rollouts(shards: list[dict]) -> dict:
    ids = sorted(i for s in shards for i in s["episode_ids"])
    return {"episode_ids": ids, "n": len(ids), "env_success": sum(s["env_success"] for s in shards),
            "errors": sum(s["errors"] for s in shards),
            "policy_digest": shards[0]["policy_digest"] if shards else None}


def _episodes_with_steps(store: TrajectoryStore, ids: list[str]) -> tuple[list[dict], dict[str, list[dict]]]:
    eps = [e for e in store.sql("SELECT * FROM episodes WHERE episode_id IN (SELECT unnest($ids)) ORDER BY episode_id",
                                {"ids": ids}) if e["status"] != "error"]
    by_ep: dict[str, list[dict]] = {}
    for s in store.steps(episode_ids=[e["episode_id"] for e in eps]):
        by_ep.setdefault(s["episode_id"], []).append(s)
    return eps, by_ep


def label_with_env(run_dir: str, rollouts: dict) -> dict:
    """Bootstrap labels: the sites' own evaluators (success iff env_score >= 1)."""
    store = TrajectoryStore(run_dir)
    eps, _ = _episodes_with_steps(store, rollouts["episode_ids"])
    store.update_episodes([{"episode_id": e["episode_id"], "success": is_success(e.get("env_score"))} for e in eps])
    n_ok = sum(1 for e in eps if is_success(e.get("env_score")))
    return {"n": len(eps), "success_rate": n_ok / max(1, len(eps))}


# ----------------------------------------------------------------------------------------- models (phase 0)
def build_tokenizer(settings: WebRLSettings, run_dir: str, demos: dict) -> ArtifactRef:
    """Byte-level BPE on the run's own corpus: demo prompts/actions and ORM prompts."""
    from webrl_core.models import train_embedded_tokenizer
    from webrl_core.prompts import build_orm_prompt

    store = TrajectoryStore(run_dir)
    eps, by_ep = _episodes_with_steps(store, demos["episode_ids"])
    texts = []
    for e in eps:
        steps = by_ep.get(e["episode_id"], [])
        texts += [s["prompt"] + s["response"] for s in steps]
        if steps:
            texts.append(build_orm_prompt(e["intent"], [s["response"] for s in steps], steps[-1]["html"] or "",
                                          settings.orm.max_html_chars) + "YES NO")
    out = Path(run_dir) / "models" / "tokenizer"
    real = versioned(out, output_key(settings, json.dumps(demos["episode_ids"])))
    train_embedded_tokenizer(texts, settings.models.embedded.vocab_size, real)
    publish(out, real)
    return ArtifactRef.of(real, "model")


def sft_actor(settings: WebRLSettings, run_dir: str, tokenizer_ref: ArtifactRef, demos: dict) -> tuple[ArtifactRef, dict]:
    """Create the embedded model and fine-tune it on successful oracle demonstrations (completion-only loss)."""
    from webrl_core.launch import sft_train
    from webrl_core.models import build_embedded_model

    store = TrajectoryStore(run_dir)
    eps, by_ep = _episodes_with_steps(store, demos["episode_ids"])
    pairs = [(s["prompt"], s["response"]) for e in eps if is_success(e.get("env_score"))
             for s in by_ep.get(e["episode_id"], [])]
    key = output_key(settings, tokenizer_ref, json.dumps(demos["episode_ids"]))
    base = versioned(Path(run_dir) / "models" / "phase=0" / "init", key)
    build_embedded_model(tokenizer_ref.path, settings.models.embedded, base, seed=settings.run.seed)
    out = Path(run_dir) / "models" / "phase=0" / "actor"
    real = versioned(out, key)
    metrics = sft_train(pairs, base, real, settings)
    publish(out, real)
    return ArtifactRef.of(real, "model"), {"sft_pairs": len(pairs), **_numeric(metrics)}


def train_orm_stage(settings: WebRLSettings, run_dir: str, rollouts: list[dict], base_ref: ArtifactRef
                    ) -> tuple[ArtifactRef, dict]:
    """ORM = SFT of the actor's backbone on (ORM prompt, YES/NO) labelled by the sites' evaluators."""
    from webrl_core.launch import train_orm
    from webrl_core.orm import OrmScorer, evaluate_orm, orm_examples_from_episodes, split_examples

    store = TrajectoryStore(run_dir)
    ids = sorted({i for r in rollouts for i in r["episode_ids"]})
    eps, by_ep = _episodes_with_steps(store, ids)
    labels = {e["episode_id"]: is_success(e.get("env_score")) for e in eps}
    examples = orm_examples_from_episodes(eps, by_ep, labels, settings.orm.max_html_chars)
    examples = balance_classes(examples, seed=settings.run.seed)
    train, held = split_examples(examples, settings.orm.eval_fraction, seed=settings.run.seed)
    out = Path(run_dir) / "models" / "phase=0" / "orm"
    real = versioned(out, output_key(settings, base_ref, json.dumps(ids)))
    train_orm(train, base_ref.path, real, settings.orm, settings.models, seed=settings.run.seed,
              training=settings.training)
    publish(out, real)
    metrics = evaluate_orm(OrmScorer(real, settings.orm, settings.models), held) if held else {}
    metrics = {f"orm_heldout_{k}": v for k, v in _numeric(metrics).items()}
    metrics.update(orm_train_examples=len(train), orm_heldout_examples=len(held),
                   orm_positive_share=sum(labels.values()) / max(1, len(labels)))
    return ArtifactRef.of(real, "model"), metrics


def balance_classes(examples: list[dict], seed: int) -> list[dict]:
    """Subsample the majority label so YES and NO are equally frequent: with the oracle demos the raw data is
    mostly YES, and an ORM trained on it learns the prior (P(YES) above 0.5 for everything)."""
    yes = [e for e in examples if e["completion"] == "YES"]
    no = [e for e in examples if e["completion"] != "YES"]
    n = min(len(yes), len(no))
    if n == 0:
        return examples
    rng = random.Random(seed)
    return sorted(rng.sample(yes, n) + rng.sample(no, n), key=lambda e: e["episode_id"])


def init_critic(settings: WebRLSettings, run_dir: str, actor_ref: ArtifactRef) -> ArtifactRef:
    """Critic = SFT backbone + two fresh heads (trained from phase 1 on)."""
    from webrl_core.critic import Critic

    out = Path(run_dir) / "models" / "phase=0" / "critic"
    real = versioned(out, output_key(settings, actor_ref))
    Critic.from_backbone(actor_ref.path, head_init_std=settings.critic.head_init_std,
                         max_length=settings.models.max_length, dtype=settings.models.dtype,
                         device=settings.models.device, seed=settings.run.seed).save(real)
    publish(out, real)
    return ArtifactRef.of(real, "model")


# ----------------------------------------------------------------------------------------- curriculum
def generate_tasks(settings: WebRLSettings, run_dir: str, phase: int, seed_purpose: str) -> tuple[ArtifactRef, dict]:
    """In-breadth evolving from phase k-1's failed tasks; de-duplicated against every earlier task."""
    from webrl_core.curriculum import ChatGenerator, EmbeddedGenerator, HFGenerator, dedupe

    store = TrajectoryStore(run_dir)
    prev = phase - 1
    args = {"p": prev, "pur": seed_purpose, "pd": phase_policy_digest(settings, run_dir, prev)}
    failed = store.sql("""SELECT DISTINCT e.site, e.task_id, e.intent, t.config_json FROM episodes e
                          JOIN tasks t USING (task_id) WHERE e.phase = $p AND e.purpose = $pur AND e.success = false
                          AND e.policy_digest = $pd ORDER BY e.site, e.task_id""", args)
    seed_source = "failed tasks"
    if not failed:  # nothing failed (or the ORM says so): evolve from all of the previous phase's tasks instead
        seed_source = "all tasks (no failures)"
        failed = store.sql("""SELECT DISTINCT e.site, e.task_id, e.intent, t.config_json FROM episodes e
                              JOIN tasks t USING (task_id) WHERE e.phase = $p AND e.purpose = $pur
                              AND e.policy_digest = $pd ORDER BY e.site, e.task_id""", args)
    by_site: dict[str, list[dict]] = {}
    for r in failed:
        by_site.setdefault(r["site"], []).append({"task_id": r["task_id"], "intent": r["intent"],
                                                   "config": json.loads(r["config_json"])})
    cur = settings.curriculum
    if cur.generator == "embedded":
        from webrl_core.sites import vary_task

        gen = EmbeddedGenerator(vary_task)
    elif cur.generator == "openai":
        import os

        gen = ChatGenerator(cur.base_url, cur.model_name, os.environ.get(settings.policy.api_key_env),
                            cur.generation_turns, cur.seed_num)
    else:
        gen = HFGenerator(cur.base_url or "", cur.model_name, None, cur.generation_turns, cur.seed_num,
                          model_dir=cur.hf_model or "")
    rng = random.Random(settings.run.seed * 7919 + phase)
    # over-generate so the filter can still keep tasks_per_phase
    n_per_site = max(1, (2 * cur.tasks_per_phase) // max(1, len(by_site))) if by_site else 0
    cands = gen.generate(by_site, rng, n_per_site)
    # de-duplicate against the tasks of earlier phases (train pools, test set, earlier generations), not against
    # this phase's own earlier output: a re-run must generate the same tasks again
    seen = [r["intent"] for r in store.sql("SELECT intent FROM tasks WHERE phase < $p", {"p": phase})]
    cands = dedupe(cands, seen)
    for c in cands:
        c["task_id"] = identity.generated_task_id(phase, c)
    per_site = _count_sites(cands)
    ref = _vjson(cands, phase_dir(run_dir, "tasks", phase) / "generated.json",
                 output_key(settings, labelled_state(run_dir, phase - 1, args["pd"])))
    return ref, {"seed_source": seed_source, "seeds": len(failed), "generated": len(cands), **{f"generated_{k}": v for k, v in per_site.items()}}


def start_page_html(settings: WebRLSettings, tasks: list[dict]) -> dict[str, str]:
    """Simplified HTML of each distinct start URL (the Round-0 observation the critic scores), via WebEnv.reset."""
    from webrl_core.env.browser import BrowserPool
    from webrl_core.env.web_env import WebEnv

    firsts: dict[str, dict] = {}
    for t in tasks:
        firsts.setdefault(t["start_url"], t)

    async def observe(hooks) -> dict[str, str]:
        out = {}
        async with BrowserPool(settings.env) as pool:
            env = WebEnv(pool, settings.env, hooks)
            for i, (url, task) in enumerate(sorted(firsts.items())):
                obs = await env.reset(task, f"start-page-{i}")
                out[url] = obs.html
            await env.close()
        return out

    with site_session(settings) as hooks:
        return asyncio.run(observe(hooks))


def filter_tasks(settings: WebRLSettings, run_dir: str, phase: int, candidates_ref: ArtifactRef,
                 critic_ref: ArtifactRef | None, trained_critic: bool, orm_ref: ArtifactRef | None
                 ) -> tuple[ArtifactRef, dict]:
    """Keep tasks whose value on the Round-0 start-page prompt lies in [filter_low, filter_high]."""
    from webrl_core.curriculum import filter_by_value, top_up
    from webrl_core.prompts import build_orm_prompt, round0_prompt

    cands = read_json(candidates_ref)
    cc = settings.critic
    how = "critic"
    if not cands:
        kept, dropped = [], []
    elif trained_critic and critic_ref is not None:
        from webrl_core.critic import Critic

        pages = start_page_html(settings, cands)
        prompts = [round0_prompt(t["intent"], pages.get(t["start_url"], ""), settings.env.obs_char_budget) for t in cands]
        critic = Critic.load(critic_ref.path, settings.models.dtype, settings.models.device, settings.models.max_length)
        v, p1, p2 = critic.values(prompts, batch_size=cc.batch_size)
        kept, dropped = filter_by_value(cands, list(zip(v.tolist(), p1.tolist(), p2.tolist())), cc.filter_low,
                                        cc.filter_high)
    elif settings.curriculum.phase1_filter == "orm" and orm_ref is not None:
        from webrl_core.orm import OrmScorer

        how = "orm"
        pages = start_page_html(settings, cands)
        scorer = OrmScorer(orm_ref.path, settings.orm, settings.models)
        p = scorer.p_yes([build_orm_prompt(t["intent"], [], pages.get(t["start_url"], ""), settings.orm.max_html_chars)
                          for t in cands])
        kept, dropped = filter_by_value(cands, [(x, x, x) for x in p], cc.filter_low, cc.filter_high)
    else:
        how = "skip (no trained critic in phase 1)"
        kept, dropped = list(cands), []
    n_passed = len(kept)
    kept = top_up(kept, dropped, math.ceil(settings.curriculum.min_kept_fraction * settings.curriculum.tasks_per_phase),
                  cc.filter_low, cc.filter_high)
    rng = random.Random(settings.run.seed * 31 + phase)
    rng.shuffle(kept)
    kept = sorted(kept[: settings.curriculum.tasks_per_phase], key=lambda t: t["task_id"])
    ref = _vjson(kept, phase_dir(run_dir, "tasks", phase) / "filtered.json",
                 output_key(settings, candidates_ref, critic_ref, trained_critic, orm_ref))
    return ref, {"filter": how, "candidates": len(cands), "kept_by_critic": n_passed, "kept": len(kept),
                 "topped_up": sum(1 for t in kept if t.get("filter_top_up")), "dropped": len(dropped),
                 **{f"kept_{k}": v for k, v in _count_sites(kept).items()}}


def materialise_tasks(run_dir: str, phase: int, tasks_ref: ArtifactRef) -> ArtifactRef:
    """Record the phase's tasks in the store and write one WebArena-Lite config per task."""
    from webrl_core.env.webarena import to_task_row

    tasks = read_json(tasks_ref)
    folder = phase_dir(run_dir, "tasks", phase) / "configs"
    folder.mkdir(parents=True, exist_ok=True)
    for t in tasks:
        (folder / f"{t['task_id']}.json").write_text(json.dumps(t, indent=1))
    TrajectoryStore(run_dir).write_tasks([to_task_row(t, phase, "generated", t.get("parent_task_id"), t.get("family"))
                                          for t in tasks])
    return _vjson(tasks, phase_dir(run_dir, "tasks", phase) / "tasks.json", tasks_ref.sha256[:12])


# ----------------------------------------------------------------------------------------- labels and data
def orm_label(settings: WebRLSettings, run_dir: str, phase: int, rollouts: dict, orm_ref: ArtifactRef) -> dict:
    """ORM P(YES) for every episode; success iff P(YES) >= threshold. Agreement with the sites' evaluators."""
    from webrl_core.orm import OrmScorer, orm_prompt_for_episode

    store = TrajectoryStore(run_dir)
    eps, by_ep = _episodes_with_steps(store, rollouts["episode_ids"])
    eps = [e for e in eps if by_ep.get(e["episode_id"])]
    scorer = OrmScorer(orm_ref.path, settings.orm, settings.models)
    p = scorer.p_yes([orm_prompt_for_episode(e, by_ep[e["episode_id"]], settings.orm.max_html_chars) for e in eps])
    thr = settings.orm.threshold
    store.update_episodes([{"episode_id": e["episode_id"], "orm_score": float(x), "success": bool(x >= thr)}
                           for e, x in zip(eps, p)])
    store.write_scores([{"kind": "orm_p_yes", "episode_id": e["episode_id"], "phase": phase, "value": float(x),
                         "model_id": orm_ref.sha256[:12]} for e, x in zip(eps, p)])
    truth = [is_success(e.get("env_score")) for e in eps]
    pred = [x >= thr for x in p]
    tp = sum(a and b for a, b in zip(pred, truth))
    fp = sum(a and not b for a, b in zip(pred, truth))
    fn = sum(b and not a for a, b in zip(pred, truth))
    n = len(eps)
    return {"episodes": n, "orm_success_rate": sum(pred) / max(1, n), "env_success_rate": sum(truth) / max(1, n),
            "orm_accuracy": sum(a == b for a, b in zip(pred, truth)) / max(1, n),
            "orm_precision": tp / max(1, tp + fp), "orm_recall": tp / max(1, tp + fn)}


def build_samples(settings: WebRLSettings, run_dir: str, phase: int, rollouts: dict) -> tuple[ArtifactRef, dict]:
    """Step-level transitions of the phase's labelled episodes (official stage 1)."""
    from webrl_core.transitions import build_transitions

    store = TrajectoryStore(run_dir)
    eps, by_ep = _episodes_with_steps(store, rollouts["episode_ids"])
    samples = build_transitions([(e, by_ep.get(e["episode_id"], [])) for e in eps], gamma=settings.actor.gamma)
    ref = _write_jsonl(samples, phase_dir(run_dir, "data", phase) / "samples.jsonl",
                       output_key(settings, json.dumps(rollouts["episode_ids"]),
                                  labelled_state(run_dir, phase, rollouts.get("policy_digest"))))
    return ref, {"samples": len(samples), "positive_samples": sum(1 for s in samples if s["trajectory_reward"] > 0)}


def select_replay(settings: WebRLSettings, run_dir: str, phase: int, actor_ref: ArtifactRef,
                  samples_ref: ArtifactRef) -> tuple[ArtifactRef, dict]:
    """Successful steps of phases < k with 1/PPL (phase-start actor) in (low, high], capped at ratio x new steps."""
    rc = settings.replay
    n_current = len(_read_jsonl(samples_ref))
    out = phase_dir(run_dir, "data", phase) / "replay.jsonl"
    key = output_key(settings, actor_ref, samples_ref)
    if not rc.enabled:
        return _write_jsonl([], out, key), {"replay_candidates": 0, "replay_kept": 0}
    from webrl_core.models import load_causal_lm, load_tokenizer
    from webrl_core.replay import score_replay
    from webrl_core.transitions import build_transitions

    store = TrajectoryStore(run_dir)
    rows = store.successful_steps(before_phase=phase, lineage=lineage(settings, run_dir, phase))
    model = load_causal_lm(actor_ref.path, settings.models)
    tok = load_tokenizer(actor_ref.path)
    picked, info = score_replay(rows, model, tok, n_current, low=rc.low, high=rc.high, cap_ratio=rc.cap_ratio,
                                max_length=settings.models.max_length, batch_size=rc.batch_size,
                                seed=settings.run.seed, progress=True)
    rank = {(r["episode_id"], r["idx"]): r["rank_score"] for r in picked}
    eps, by_ep = _episodes_with_steps(store, sorted({e for e, _ in rank}))
    samples = build_transitions([(e, by_ep.get(e["episode_id"], [])) for e in eps], gamma=settings.actor.gamma)
    kept = [dict(x, rank_score=rank[(x["episode_id"], x["step_idx"])]) for x in samples
            if (x["episode_id"], x["step_idx"]) in rank]
    ref = _write_jsonl(kept, out, key)
    return ref, {"replay_candidates": len(rows), "replay_kept": len(kept), **_numeric(info)}


# ----------------------------------------------------------------------------------------- training
def _train_or_carry_over(out: Path, real: Path, samples: list[dict], prev_ref: ArtifactRef, train
                         ) -> tuple[ArtifactRef, dict]:
    """Train into ``real`` and publish it as ``out``; with no samples (no new data, no replay) the previous
    model carries over unchanged, recorded as skipped."""
    if samples:
        metrics = _numeric(train(samples, real))
    else:
        import shutil

        shutil.copytree(prev_ref.path, real)
        metrics = {"n_samples": 0.0, "skipped": 1.0}
    publish(out, real)
    return ArtifactRef.of(real, "model"), metrics


def train_critic_stage(settings: WebRLSettings, run_dir: str, phase: int, samples_ref: ArtifactRef,
                       replay_ref: ArtifactRef, backbone_ref: ArtifactRef, prev_critic_ref: ArtifactRef
                       ) -> tuple[ArtifactRef, dict]:
    from webrl_core.launch import train_critic

    out = Path(run_dir) / "models" / f"phase={phase}" / "critic"
    real = versioned(out, output_key(settings, samples_ref, replay_ref, backbone_ref, prev_critic_ref))
    return _train_or_carry_over(
        out, real, _read_jsonl(samples_ref) + _read_jsonl(replay_ref), prev_critic_ref,
        lambda samples, dst: train_critic(samples, backbone_ref.path, dst, settings, resume=prev_critic_ref.path))


def train_actor_stage(settings: WebRLSettings, run_dir: str, phase: int, samples_ref: ArtifactRef,
                      replay_ref: ArtifactRef, actor_ref: ArtifactRef, critic_ref: ArtifactRef
                      ) -> tuple[ArtifactRef, dict]:
    from webrl_core.launch import train_actor

    out = Path(run_dir) / "models" / f"phase={phase}" / "actor"
    real = versioned(out, output_key(settings, samples_ref, replay_ref, actor_ref, critic_ref))
    return _train_or_carry_over(
        out, real, _read_jsonl(samples_ref) + _read_jsonl(replay_ref), actor_ref,
        lambda samples, dst: train_actor(samples, actor_ref.path, dst, settings, critic_dir=critic_ref.path))


# ----------------------------------------------------------------------------------------- evaluation
def evaluate(settings: WebRLSettings, run_dir: str, phase: int, actor_ref: ArtifactRef | None,
             test_ref: ArtifactRef, purpose: str = "eval", name: str | None = None) -> tuple[ArtifactRef, dict]:
    """Roll out the actor on the test set at eval temperature; per site, solved / failed / errored episodes by
    the sites' evaluators. ``success_rate`` = solved / scored (errored episodes are reported apart, never
    counted as failures; more than ``env.max_error_rate`` of them fails the rollout). Written to
    ``eval/<name>.json`` (``phase=k`` for a phase, ``model=<digest>`` for a checkpoint evaluated on its own)."""
    r = rollout(settings, run_dir, phase, purpose, test_ref, actor_ref, settings.policy.eval_temperature)
    store = TrajectoryStore(run_dir)
    eps = store.sql("SELECT site, env_score, status, policy_digest FROM episodes WHERE episode_id IN (SELECT unnest($ids))",
                    {"ids": r["episode_ids"]})
    stale = {e["policy_digest"] for e in eps} - {r["policy_digest"]}
    if stale:
        raise RuntimeError(f"evaluation of {r['policy_digest']} read episodes of other policies {sorted(stale)}")
    table: dict[str, dict] = {}
    for e in eps:
        row = table.setdefault(e["site"], {"n": 0, "success": 0, "failed": 0, "errors": 0})
        row["n"] += 1
        if e["status"] == "error":
            row["errors"] += 1
        elif (e["env_score"] or 0) >= 1.0:
            row["success"] += 1
        else:
            row["failed"] += 1
    total = {k: sum(v[k] for v in table.values()) for k in ("n", "success", "failed", "errors")}
    scored = total["success"] + total["failed"]
    result = {"phase": phase, "sites": table, "total": total, "success_rate": total["success"] / max(1, scored),
              "actor": actor_ref.path if actor_ref else purpose, "policy_digest": r["policy_digest"],
              "episode_ids": r["episode_ids"]}
    name = name or f"phase={phase}"
    ref = _vjson(result, Path(run_dir) / "eval" / f"{name}.json", output_key(settings, actor_ref, test_ref))
    metrics = {"test_success_rate": result["success_rate"], "test_solved": float(total["success"]),
               "test_failed": float(total["failed"]), "test_errored": float(total["errors"]),
               **{f"test_success_{s}": v["success"] / max(1, v["success"] + v["failed"]) for s, v in table.items()}}
    return ref, metrics


# ----------------------------------------------------------------------------------------- helpers
def _numeric(d: dict | None) -> dict[str, float]:
    return {k: float(v) for k, v in (d or {}).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _count_sites(tasks: list[dict]) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in tasks:
        out[t["sites"][0]] = out.get(t["sites"][0], 0) + 1
    return out


def _vjson(obj, path: Path, key: str) -> ArtifactRef:
    real = versioned(path, key)
    ref = write_json(obj, real)
    publish(path, real)
    return ref


def _write_jsonl(rows: list[dict], path: Path, key: str) -> ArtifactRef:
    import os

    real = versioned(path, key)
    tmp = real.with_suffix(real.suffix + ".tmp")
    with open(tmp, "w") as fh:
        for r in rows:
            fh.write(json.dumps(r, sort_keys=True, default=str) + "\n")
    os.replace(tmp, real)
    publish(path, real)
    return ArtifactRef.of(real, "dataset")


def _read_jsonl(ref: ArtifactRef) -> list[dict]:
    with open(ref.path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def timed(fn, *a, **kw) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn(*a, **kw)
    return out, time.perf_counter() - t0


def run_identity(run_dir: str | Path) -> str:
    """A UUID stored in the run dir; part of every cache key, so a re-created run dir never reuses stale results."""
    import uuid

    p = Path(run_dir) / ".run-id"
    if not p.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(uuid.uuid4().hex)
    return p.read_text().strip()


def model_ref(run_dir: str | Path, phase: int, name: str) -> ArtifactRef:
    p = Path(run_dir) / "models" / f"phase={phase}" / name
    if not p.exists():
        raise FileNotFoundError(f"{p} does not exist: run phase {phase} (or the bootstrap) first")
    return ArtifactRef.of(p, "model")


def labelled_state(run_dir: str | Path, phase: int, policy_digest: str | None = None) -> str:
    """Digest of a phase's episode labels (the seeds of the next generation), of one policy's episodes if given."""
    import hashlib

    q = "SELECT episode_id, success FROM episodes WHERE phase = $p"
    args: dict = {"p": phase}
    if policy_digest is not None:
        q, args["pd"] = q + " AND policy_digest = $pd", policy_digest
    rows = TrajectoryStore(run_dir).sql(q + " ORDER BY episode_id", args)
    return hashlib.sha256(json.dumps(rows, default=str).encode()).hexdigest()
