"""WebRL's flows. A phase is one flow whose steps are cached Prefect tasks (tasks/stages.py).

    webrl-bootstrap  phase 0: oracle demos -> tokenizer -> SFT actor -> SFT/random rollouts labelled by the
                     sites -> ORM -> critic init -> baseline evaluation
    webrl-phase      phase k: generate -> filter -> (review) -> materialise -> rollouts -> ORM labels ->
                     transitions -> replay -> critic -> actor -> export -> evaluation
    webrl-train      bootstrap (when needed) + N phases as sub-flows
    webrl-eval       a checkpoint on the test set, per-site success table
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from tasks import stages as T
from webrl_core import report, runlock, stages, tracking, validate
from webrl_core.config import WebRLSettings, load_config


@contextlib.contextmanager
def _run(config: str, overrides: list[str] | None, run_dir: str | None, flow: str, run_name: str,
         phase: int | None = None, model: str | None = None) -> Iterator[tuple[WebRLSettings, str, str]]:
    """The plumbing around a flow body: resolve the config; check every input before any work
    (``validate.preflight``: run dir, test set, store, endpoint, checkpoints); hold the run dir's lock (a second
    flow on the same run dir is refused, never run twice; ``runlock``); record the config (an earlier, different
    one is kept); open the MLflow run. Yields (settings, run dir, run id)."""
    s = load_config(config, sets=overrides or [])
    rd = str(Path(run_dir or s.run_dir()).resolve())
    runlock.check_free(rd, f"webrl-{flow}", phase)  # busy: say so, not what the running flow has yet to write
    for warning in validate.preflight(s, rd, model=model, phase=phase, flow=flow):
        get_run_logger().warning(warning)
    with runlock.hold(rd, flow=f"webrl-{flow}", phase=phase):
        validate.record_config(rd, s)
        with tracking.start_run(rd, run_name, config=s.model_dump(mode="json"), experiment=s.tracking.experiment,
                                configured_uri=s.tracking.mlflow_uri):
            yield s, rd, stages.run_identity(rd)


def _rollout(s, rd, rid, phase, purpose, tasks_ref, actor_ref, temperature, n_shards):
    futures = [T.rollout_shard.submit(T.cfg_for(s, "rollout"), rd, rid, phase, purpose, tasks_ref, actor_ref,
                                      temperature, i, n_shards) for i in range(n_shards)]
    return stages.merge_rollouts([f.result() for f in futures])


@flow(name="webrl-bootstrap", log_prints=True)
def webrl_bootstrap(config: str = "demo", run_dir: str | None = None, overrides: list[str] | None = None) -> dict:
    """Phase 0 for the embedded default (or existing SFT/ORM checkpoints for real models)."""
    log = get_run_logger()
    with _run(config, overrides, run_dir, "bootstrap", "webrl-bootstrap") as (s, rd, rid):
        b = s.bootstrap
        metrics: dict = {}
        test_ref = T.test_set(T.cfg_for(s, "test"), rd, rid)
        if b.sft_actor:
            actor_ref = stages.ArtifactRef.of(b.sft_actor, "model")
            if not s.models.orm:
                raise ValueError("bootstrap.sft_actor is set: models.orm must name the ORM checkpoint too")
            orm_ref = stages.ArtifactRef.of(s.models.orm, "model")
        else:
            demo_tasks = T.train_pool(T.cfg_for(s, "pool"), rd, rid, b.demo_tasks, 1, "demo_tasks")
            demos = _rollout(s, rd, rid, 0, "oracle", demo_tasks, None, 0.0, b.n_shards)
            metrics["oracle_success_rate"] = T.label_with_env(rd, rid, demos)["success_rate"]
            tok_ref = T.build_tokenizer(T.cfg_for(s, "tokenizer"), rd, rid, demos)
            actor_ref, sft_m = T.sft_actor(T.cfg_for(s, "sft"), rd, rid, tok_ref, demos)
            metrics.update({f"sft_{k}": v for k, v in sft_m.items()})
            sft_tasks = T.train_pool(T.cfg_for(s, "pool"), rd, rid, b.rollout_tasks, 2, "sft_rollout_tasks")
            sft_roll = _rollout(s, rd, rid, 0, "bootstrap", sft_tasks, actor_ref, s.policy.temperature, b.n_shards)
            metrics["sft_rollout_success_rate"] = T.label_with_env(rd, rid, sft_roll)["success_rate"]
            rolls = [demos, sft_roll]
            if b.random_tasks:
                rnd_tasks = T.train_pool(T.cfg_for(s, "pool"), rd, rid, b.random_tasks, 3, "random_tasks")
                rnd = _rollout(s, rd, rid, 0, "random", rnd_tasks, None, 1.0, b.n_shards)
                T.label_with_env(rd, rid, rnd)
                rolls.append(rnd)
            orm_ref, orm_m = T.train_orm(T.cfg_for(s, "orm_train"), rd, rid, rolls, actor_ref)
            metrics.update(orm_m)
        critic_ref = T.init_critic(T.cfg_for(s, "critic_init"), rd, rid, actor_ref)
        eval_ref, eval_m = T.evaluate(T.cfg_for(s, "eval"), rd, rid, 0, actor_ref, test_ref)
        metrics.update(eval_m)
        tracking.log_metrics(metrics, step=0)
        create_markdown_artifact(report.publish_phase(rd, 0, metrics), key="webrl-phase-0",
                                 description="bootstrap summary")
        log.info("bootstrap done: test success %.3f", eval_m["test_success_rate"])
        return {"actor": actor_ref, "orm": orm_ref, "critic": critic_ref, "eval": eval_ref, "metrics": metrics}


@flow(name="webrl-phase", log_prints=True)
def webrl_phase(config: str = "demo", phase: int = 1, run_dir: str | None = None,
                overrides: list[str] | None = None) -> dict:
    """One WebRL phase k >= 1; reads actor/critic of phase k-1 and its failed tasks from the run dir."""
    log = get_run_logger()
    with _run(config, overrides, run_dir, "phase", f"webrl-phase-{phase}", phase=phase) as (s, rd, rid):
        prev_actor = stages.model_ref(rd, phase - 1, "actor")
        prev_critic = stages.model_ref(rd, phase - 1, "critic")
        sft_actor = stages.model_ref(rd, 0, "actor")
        orm_ref = stages.ArtifactRef.of(s.models.orm, "model") if s.models.orm else stages.model_ref(rd, 0, "orm")
        seed_purpose = "bootstrap" if phase == 1 else "rollout"
        m: dict = {}
        test_ref = T.test_set(T.cfg_for(s, "test"), rd, rid)
        cands, gen_m = T.generate_tasks(T.cfg_for(s, "generate"), rd, rid, phase, seed_purpose,
                                        stages.labelled_state(rd, phase - 1, stages.phase_policy_digest(s, rd, phase - 1)))
        m.update(gen_m)
        kept, filt_m = T.filter_tasks(T.cfg_for(s, "filter"), rd, rid, phase, cands, prev_critic, phase > 1, orm_ref)
        m.update(filt_m)
        if s.curriculum.human_review:
            from flows.review import review_tasks

            kept = review_tasks(rd, phase, kept, s.curriculum.review_timeout_s, s.curriculum.review_default)
        tasks_ref = T.materialise_tasks(rd, rid, phase, kept)
        m["kept_by_review"] = len(stages.read_json(tasks_ref))
        rolls = _rollout(s, rd, rid, phase, "rollout", tasks_ref, prev_actor, s.policy.temperature,
                         s.bootstrap.n_shards)
        m.update({"rollout_episodes": rolls["n"], "rollout_errors": rolls["errors"]})
        labels = T.orm_label(T.cfg_for(s, "orm_label"), rd, rid, phase, rolls, orm_ref)
        m.update(labels)
        samples_ref, sm = T.build_samples(T.cfg_for(s, "samples"), rd, rid, phase, rolls, labels)
        m.update(sm)
        replay_ref, rm = T.select_replay(T.cfg_for(s, "replay"), rd, rid, phase, prev_actor, samples_ref)
        m.update(rm)
        critic_ref, cm = T.train_critic(T.cfg_for(s, "train"), rd, rid, phase, samples_ref, replay_ref, sft_actor,
                                        prev_critic)
        m.update({f"critic_{k}": v for k, v in cm.items()})
        actor_ref, am = T.train_actor(T.cfg_for(s, "train"), rd, rid, phase, samples_ref, replay_ref, prev_actor,
                                      critic_ref)
        m.update({f"actor_{k}": v for k, v in am.items()})
        eval_ref, em = T.evaluate(T.cfg_for(s, "eval"), rd, rid, phase, actor_ref, test_ref)
        m.update(em)
        tracking.log_metrics(m, step=phase)
        create_markdown_artifact(report.publish_phase(rd, phase, m, actor_ref=actor_ref), key=f"webrl-phase-{phase}",
                                 description=f"phase {phase} summary")
        create_table_artifact(report.results_table(rd), key=f"webrl-success-phase-{phase}",
                              description="test success per site")
        log.info("phase %d done: test success %.3f", phase, em["test_success_rate"])
        return {"actor": actor_ref, "critic": critic_ref, "eval": eval_ref, "metrics": m}


@flow(name="webrl-train", log_prints=True)
def webrl_train(config: str = "demo", phases: int | None = None, run_dir: str | None = None,
                overrides: list[str] | None = None) -> dict:
    """Bootstrap (when needed) then N phases, each a sub-flow, nested under one MLflow run."""
    out = {}
    with _run(config, overrides, run_dir, "train", "webrl-train") as (s, rd, rid):
        n = s.run.phases if phases is None else phases
        out[0] = webrl_bootstrap(config, rd, overrides)
        for k in range(1, n + 1):
            out[k] = webrl_phase(config, k, rd, overrides)
        table = report.results_table(rd)
        tracking.log_artifact(report.write_summary(rd), "summary")
    return {"run_dir": rd, "table": table, "phases": {k: v["metrics"] for k, v in out.items()}}


@flow(name="webrl-eval", log_prints=True)
def webrl_eval(config: str = "demo", model: str = "", run_dir: str | None = None,
               overrides: list[str] | None = None, tag: int = 100) -> dict:
    """Evaluate a checkpoint (HF folder) on the test set; its episodes are stored as phase `tag` with purpose
    eval and keyed by the checkpoint's digest, the result in ``eval/model=<digest[:12]>.json``."""
    with _run(config, overrides, run_dir, "eval", "webrl-eval", model=model) as (s, rd, rid):
        if not model and s.policy.backend == "hf":
            raise ValueError("webrl eval: --model names the HF checkpoint folder to evaluate (policy.backend=hf)")
        actor = stages.ArtifactRef.of(model, "model") if model else None
        name = f"model={actor.sha256[:12]}" if actor else f"model={s.policy.backend}"
        test_ref = T.test_set(T.cfg_for(s, "test"), rd, rid)
        eval_ref, em = T.evaluate(T.cfg_for(s, "eval"), rd, rid, tag, actor, test_ref, name)
        tracking.log_metrics({**em, "policy_digest": stages.read_json(eval_ref)["policy_digest"]})
    return {"eval": stages.read_json(eval_ref), "metrics": em}
