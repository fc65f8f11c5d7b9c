"""Experience: rollouts of a task set, their labels, and the training samples built from them.

Labels: in phase 0 the sites' evaluators (``label_with_env``); in phase k the outcome reward model
(``orm_label``: success iff P(YES) >= ``orm.threshold``, paper Sec. 3.2), or with ``reward.source: judge`` PAE's
zero-shot evaluator (``judge_label``); the labeller's agreement with the evaluators is reported. Samples:
step-level transitions of the phase's episodes (official ``process_data.py``, stage 1), and the perplexity replay
set: successful steps of earlier phases in the current lineage whose 1/PPL under the phase-start actor lies in
(``replay.low``, ``replay.high``], at most ``replay.cap_ratio`` x the new steps (paper Sec. 3.3, "experience replay
buffer with actor confidence filtering").
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from webrl_core.artifacts import ArtifactRef, read_json, read_jsonl
from webrl_core.env.judge import judge_from_settings
from webrl_core.env.rollout import default_attempts, plan_episode_ids, run_rollout
from webrl_core.learn import frozen_prefix
from webrl_core.learn.model_flops import DecoderShape, flop_stats, rates_around
from webrl_core.learn.models import autocast_context, load_causal_lm, load_tokenizer
from webrl_core.learn.orm import OrmScorer, decision_agreement, orm_prompt_for_episode
from webrl_core.learn.outcome_judge import judge_case, outcome_judge_from_settings
from webrl_core.prompts import prompt_format
from webrl_core.pipeline.stage import stage
from webrl_core.scale.ray_rollout import run_on_ray
from webrl_core.learn.replay import score_replay
from webrl_core.agent.rollout_policy import lineage, make_policy, needs_server, rollout_identity
from webrl_core.agent.serving import served_actor
from webrl_core.runs.rundir import labelled_state, output_key, phase_dir, write_jsonl_version
from webrl_core.sites.session import site_session
from webrl_core.runs.store import TrajectoryStore
from webrl_core.learn.transitions import build_transitions
from webrl_core.websites import is_success

ROLLOUT_SECTIONS = ("run", "sites", "env", "policy", "serving", "models", "prompt", "rollout", "eval")


@stage(*ROLLOUT_SECTIONS)
def rollout(settings, run_dir: str, phase: int, purpose: str, tasks_ref: ArtifactRef,
            actor_ref: ArtifactRef | None, temperature: float, shard: int = 0, n_shards: int = 1,
            samples_per_task: int = 1) -> dict:
    """Roll out a shard of a task set, ``samples_per_task`` episodes per task (attempts 0, 1, ...; the shards split
    the episodes, not the tasks); every finished episode goes to the store as it ends.

    Resumable: an episode whose id (task content, policy identity, settings, seed, attempt; see
    ``webrl_core.identity``) is already stored without error is reused, so a killed rollout re-run loses at most
    the episodes that were in flight and duplicates nothing, while a changed policy or knob gets new episodes.
    Fails when more than ``env.max_error_rate`` of the shard's episodes errored (they stay stored)."""
    if samples_per_task < 1:
        raise ValueError(f"rollout: samples_per_task must be >= 1, got {samples_per_task}")
    every = [t for t in read_json(tasks_ref) for _ in range(samples_per_task)]
    # attempts are numbered over the whole set before sharding: a task's samples in two shards stay distinct
    tasks, attempts = every[shard::n_shards], default_attempts(every)[shard::n_shards]
    store = TrajectoryStore(run_dir)
    seed = settings.run.seed
    ident = rollout_identity(settings, actor_ref, temperature, purpose)
    ids = plan_episode_ids(tasks, phase=phase, purpose=purpose, seed=seed, attempts=attempts, **ident)
    done = {e["episode_id"] for e in store.sql(
        "SELECT episode_id FROM episodes WHERE episode_id IN (SELECT unnest($ids)) AND status <> 'error'", {"ids": ids})}
    todo = [(t, a) for t, a, i in zip(tasks, attempts, ids) if i not in done]
    with contextlib.ExitStack() as stack:
        endpoint = None
        if todo and needs_server(settings, actor_ref, purpose):  # the actor, served for this rollout only
            endpoint = stack.enter_context(served_actor(settings, actor_ref, run_dir))
            if endpoint.policy_digest != ident["policy_digest"]:
                raise RuntimeError(f"the served actor is {endpoint.policy_digest}, but the episodes are keyed by "
                                   f"{ident['policy_digest']}")
        if todo and settings.rollout.engine == "ray":  # shards on a Ray cluster; the driver writes the store
            run_on_ray(settings, settings.rollout, run_dir, phase, purpose, [t for t, _ in todo],
                       [a for _, a in todo], actor_ref, temperature, ident, endpoint=endpoint)
        elif todo:
            policy = make_policy(settings, actor_ref, temperature, purpose, endpoint)
            with site_session(settings) as hooks:
                run_rollout([t for t, _ in todo], policy, settings.env.n_envs, cfg=settings.env, hooks=hooks,
                            store=store, phase=phase, purpose=purpose, seed=seed, attempts=[a for _, a in todo],
                            progress=True, screenshot_dir=Path(run_dir) / "screenshots",
                            judge=judge_from_settings(settings), prompt_compat=prompt_format(settings), **ident)
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
        first = "\n".join(f"  {e['episode_id']}: {(e.get('error') or '?').strip().splitlines()[0][:300]}"
                          for e in errs[:3])
        raise RuntimeError(f"{what}: {len(errs)} of {len(episodes)} episodes errored ({len(errs) / len(episodes):.0%} > "
                           f"env.max_error_rate={limit:g}); the errored ones are stored and re-run on the next "
                           f"attempt. First errors:\n{first}")


def merge_rollouts(shards: list[dict]) -> dict:
    """One rollout result from its shards'."""
    ids = sorted(i for s in shards for i in s["episode_ids"])
    return {"episode_ids": ids, "n": len(ids), "env_success": sum(s["env_success"] for s in shards),
            "errors": sum(s["errors"] for s in shards),
            "policy_digest": shards[0]["policy_digest"] if shards else None}


@stage()
def label_with_env(run_dir: str, rollouts: dict) -> dict:
    """Bootstrap labels: the sites' own evaluators. An unscored episode (its task needs the LLM judge and none is
    configured) gets no label, so it is neither a success nor a failure downstream."""
    store = TrajectoryStore(run_dir)
    eps, _ = store.finished_episodes(rollouts["episode_ids"])
    store.update_episodes([{"episode_id": e["episode_id"], "success": env_label(e)} for e in eps])
    n_ok = sum(1 for e in eps if is_success(e.get("env_score")))
    unscored = sum(1 for e in eps if env_label(e) is None)
    return {"n": len(eps), "success_rate": n_ok / max(1, len(eps) - unscored), "unscored": unscored}


def env_label(episode: dict) -> bool | None:
    """The sites' evaluators' verdict on a finished episode; None when it was not scored (``env_score`` NULL)."""
    return None if episode.get("env_score") is None else is_success(episode["env_score"])


@stage("models", "orm", "reward", "prompt")
def orm_label(settings, run_dir: str, phase: int, rollouts: dict, orm_ref: ArtifactRef) -> dict:
    """Label the phase's episodes: ``reward.source: orm`` success iff the ORM's P(YES) >= ``orm.threshold``
    (paper Sec. 3.2); ``env``: the sites' evaluators. The ORM scores every episode in both cases, and its
    agreement with the evaluators (accuracy, precision and recall of YES) is reported, with the counts of
    episodes the evaluators solved (``env_successes``) and the ORM called YES (``orm_yes``)."""
    store = TrajectoryStore(run_dir)
    eps, by_ep = store.finished_episodes(rollouts["episode_ids"])
    eps = [e for e in eps if by_ep.get(e["episode_id"])]
    scorer, fmt = OrmScorer(orm_ref.path, settings.orm, settings.models), prompt_format(settings)
    p = scorer.p_yes([orm_prompt_for_episode(e, by_ep[e["episode_id"]], settings.orm.max_html_chars, compat=fmt)
                      for e in eps])
    thr = settings.orm.threshold
    truth = [env_label(e) for e in eps]  # None: unscored (no judge for its task), left out of the agreement
    pred = [bool(x >= thr) for x in p]
    label = truth if settings.reward.source == "env" else pred
    store.update_episodes([{"episode_id": e["episode_id"], "orm_score": float(x), "success": y}
                           for e, x, y in zip(eps, p, label)])
    store.write_scores([{"kind": "orm_p_yes", "episode_id": e["episode_id"], "phase": phase, "value": float(x),
                         "model_id": orm_ref.sha256[:12]} for e, x in zip(eps, p)])
    scored = [(a, b) for a, b in zip(pred, truth) if b is not None]
    agree = decision_agreement([a for a, _ in scored], [b for _, b in scored])
    n, labelled = len(eps), [y for y in label if y is not None]
    return {"episodes": n, "reward_source": settings.reward.source, "unscored": n - len(scored),
            "env_successes": sum(b for _, b in scored), "orm_yes": sum(pred),
            "labelled_success_rate": sum(labelled) / max(1, len(labelled)),
            "orm_success_rate": sum(pred) / max(1, n), "env_success_rate": sum(b for _, b in scored) / max(1, len(scored)),
            "orm_accuracy": agree["accuracy"] if scored else 0.0,
            "orm_precision": agree["precision"], "orm_recall": agree["recall"]}


# env.screenshots: the settings refuse reward.judge_screenshots without it, so the task's rebuilt settings need it
@stage("models", "reward", "prompt.observation", "env.screenshots")
def judge_label(settings, run_dir: str, phase: int, rollouts: dict) -> dict:
    """Label the phase's episodes with PAE's autonomous evaluator (``webrl_core.learn.outcome_judge``):
    ``reward.source: judge`` success iff the judge (``reward.judge``: an endpoint or a local model) says so;
    ``env``: the sites' evaluators, the judge still measured. The judge's P(success) goes to the scores table
    (kind ``judge_p_success``; an endpoint reply without a verdict is stored as NULL with the reply as its note and
    leaves the episode unlabelled). Returns ``orm_label``'s counts where they mean the same, and the judge's
    agreement with the evaluators (accuracy, precision and recall of its successes, over the episodes both scored)."""
    rw = settings.reward
    if rw.source == "orm":
        raise ValueError("judge_label labels with reward.source: judge (or env, the judge measured); "
                         "reward.source: orm is orm_label's")
    store = TrajectoryStore(run_dir)
    eps, by_ep = store.finished_episodes(rollouts["episode_ids"])
    eps = [e for e in eps if by_ep.get(e["episode_id"])]
    shots = Path(run_dir) / "screenshots"
    cases = [judge_case(e, by_ep[e["episode_id"]], max_page_chars=rw.judge_max_html_chars,
                        observation=settings.prompt.observation, screenshot_dir=shots / e["episode_id"],
                        n_screenshots=rw.judge_screenshots) for e in eps]
    judge = outcome_judge_from_settings(settings) if cases else None
    verdicts = judge.judge(cases) if judge is not None else []
    pred = [v.success for v in verdicts]  # None: the endpoint's reply had no verdict
    # None: unscored by the evaluators, left out of the agreement; so are the episodes of tasks an LLM proposer
    # wrote (judge_only: their evaluator is a placeholder, whose score says nothing)
    judge_only = {t["task_id"] for t in store.tasks(phase=phase) if json.loads(t["config_json"]).get("judge_only")}
    truth = [None if e["task_id"] in judge_only else env_label(e) for e in eps]
    label = truth if rw.source == "env" else pred
    store.update_episodes([{"episode_id": e["episode_id"], "success": y} for e, y in zip(eps, label)])
    store.write_scores([{"kind": "judge_p_success", "episode_id": e["episode_id"], "phase": phase,
                         "value": v.p_success, "model_id": judge.name, "note": v.note[:500]}
                        for e, v in zip(eps, verdicts)])
    both = [(a, b) for a, b in zip(pred, truth) if a is not None and b is not None]
    agree = decision_agreement([a for a, _ in both], [b for _, b in both])
    env_scored = [b for b in truth if b is not None]
    said = [a for a in pred if a is not None]
    n, labelled = len(eps), [y for y in label if y is not None]
    return {"episodes": n, "reward_source": rw.source, "unscored": n - len(env_scored),
            "env_successes": sum(env_scored), "judge_yes": sum(said), "judge_unparsed": n - len(said),
            "labelled_success_rate": sum(labelled) / max(1, len(labelled)),
            "judge_success_rate": sum(said) / max(1, len(said)),
            "env_success_rate": sum(env_scored) / max(1, len(env_scored)),
            "judge_accuracy": agree["accuracy"] if both else 0.0,
            "judge_precision": agree["precision"], "judge_recall": agree["recall"]}


@stage("transitions")
def phase_transitions(settings, run_dir: str, phase: int, rollouts: dict) -> tuple[ArtifactRef, dict]:
    """Step-level transitions of the phase's labelled episodes (official ``process_data.py``, stage 1)."""
    store = TrajectoryStore(run_dir)
    eps, by_ep = store.finished_episodes(rollouts["episode_ids"])
    unlabelled = [e for e in eps if e.get("success") is None]  # unscored by the env with reward.source: env
    eps = [e for e in eps if e.get("success") is not None]
    samples = build_transitions([(e, by_ep.get(e["episode_id"], [])) for e in eps], gamma=settings.transitions.gamma)
    ref = write_jsonl_version(samples, phase_dir(run_dir, "data", phase) / "samples.jsonl",
                              output_key(settings, json.dumps(rollouts["episode_ids"]),
                                         labelled_state(run_dir, phase, rollouts.get("policy_digest"))))
    return ref, {"samples": len(samples), "positive_samples": sum(1 for s in samples if s["trajectory_reward"] > 0),
                 "unlabelled_episodes": len(unlabelled)}


@stage("run", "models", "replay", "transitions", "policy", "serving")
def replay_transitions(settings, run_dir: str, phase: int, actor_ref: ArtifactRef, samples_ref: ArtifactRef
                       ) -> tuple[ArtifactRef, dict]:
    """Successful steps of phases < k in the current lineage with 1/PPL under the phase-start actor in
    (low, high], capped at cap_ratio x the phase's new steps, as transitions with their ``rank_score``."""
    rc = settings.replay
    n_current = len(read_jsonl(samples_ref))
    out = phase_dir(run_dir, "data", phase) / "replay.jsonl"
    key = output_key(settings, actor_ref, samples_ref)
    if not rc.enabled:
        return write_jsonl_version([], out, key), {"replay_candidates": 0, "replay_kept": 0}
    store = TrajectoryStore(run_dir)
    rows = store.successful_steps(before_phase=phase, lineage=lineage(settings, run_dir, phase))
    model = load_causal_lm(actor_ref.path, settings.models)
    frozen_prefix.attach(model, settings.models)  # the picked steps come back in the actor's epoch
    tok = load_tokenizer(actor_ref.path)
    device = next(model.parameters()).device
    looked_up = frozen_prefix.stats()
    # in the training forward's autocast: the actor's epoch then finds these rows' bottom layers in the cache (its
    # key includes the autocast), and the reference log-probs reused from the 1/PPL are the training forward's;
    # the scoring pass against the box's rates around it, as a training stage's (learn/model_flops.py)
    with rates_around(settings.models.dtype, str(device)) as rates, autocast_context(settings.models, device):
        picked, info = score_replay(rows, model, tok, n_current, low=rc.low, high=rc.high, cap_ratio=rc.cap_ratio,
                                    max_length=settings.models.max_length, batch_size=rc.batch_size,
                                    seed=settings.run.seed, progress=True, scoring=rc.scoring)
    shape, seconds = DecoderShape.of(model), info.pop("score_s")
    tokens, tokens_sq = info.pop("scored_tokens"), info.pop("scored_tokens_sq")
    flops = shape.pass_flops(tokens, tokens_sq, frozen_prefix.tokens_since(looked_up)) if shape else None
    cost = {"replay_s": seconds, "replay_tokens": tokens, "replay_tokens_sq": tokens_sq,
            "replay_peak_flops": rates.peak_flops, "replay_copy_bytes_per_s": rates.copy_bytes_per_s,
            **flop_stats("replay_", flops, seconds, rates.peak_flops)}
    rank = {(r["episode_id"], r["idx"]): r["rank_score"] for r in picked}
    eps, by_ep = store.finished_episodes(sorted({e for e, _ in rank}))
    samples = build_transitions([(e, by_ep.get(e["episode_id"], [])) for e in eps], gamma=settings.transitions.gamma)
    kept = [dict(x, rank_score=rank[(x["episode_id"], x["step_idx"])]) for x in samples
            if (x["episode_id"], x["step_idx"]) in rank]
    ref = write_jsonl_version(kept, out, key)
    return ref, {"replay_candidates": len(rows), "replay_kept": len(kept), **numeric(info), **numeric(cost)}


def numeric(d: dict | None) -> dict[str, float]:
    """The numeric entries of a metrics dict, as floats (what MLflow logs)."""
    return {k: float(v) for k, v in (d or {}).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
