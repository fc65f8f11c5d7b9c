"""WebRL's flows. A phase is one flow whose steps are cached Prefect tasks: ``run(stage, ...)`` runs the task
tasks/stages.py declares for a stage function of ``webrl_core.pipeline``.

    webrl-bootstrap  phase 0: oracle demos -> tokenizer -> SFT actor -> SFT/random rollouts labelled by the
                     sites -> ORM -> critic init -> baseline evaluation
    webrl-phase      phase k: generate -> filter -> (review) -> materialise -> rollouts -> ORM labels ->
                     transitions -> replay -> critic -> actor -> export -> evaluation. The other recipes run the
                     same flow (``--config grpo | pae``): a critic-free actor loss (``actor.loss: grpo``,
                     WebAgent-R1's M-GRPO, or ``filtered_bc``, PAE's) has no critic stage and no value filter;
                     ``reward.source: judge`` labels the episodes by a zero-shot judge instead of the ORM
    webrl-train      bootstrap (when needed) + N phases as sub-flows
    webrl-eval       a checkpoint on the test set, per-site success table
"""

from __future__ import annotations

import time

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from flows.context import RunContext, open_run
from flows.review import review_tasks
from webrl_core.runs import report, tracking
from webrl_core.config import ActorTrainConfig
from webrl_core.experiments.recipes import recipe_of
from webrl_core.artifacts import ArtifactRef, read_json
from webrl_core.pipeline import bootstrap, evaluation, experience, generation, task_sets, updates
from webrl_core.pipeline.experience import merge_rollouts
from webrl_core.pipeline.validate import check_phase_count
from webrl_core.agent.rollout_policy import needs_server, phase_policy_digest
from webrl_core.runs.rundir import labelled_state


def rollout(run: RunContext, phase: int, purpose: str, tasks_ref, actor_ref, temperature: float,
            samples_per_task: int = 1) -> dict:
    """A rollout of a task set (``samples_per_task`` episodes per task), as ``bootstrap.n_shards`` concurrent shards
    (one when the actor is served: one engine per rollout, which batches the requests of all its browsers)."""
    n = 1 if needs_server(run.settings, actor_ref, purpose) else run.settings.bootstrap.n_shards
    shards = [run.submit(experience.rollout, phase, purpose, tasks_ref, actor_ref, temperature, i, n,
                         samples_per_task) for i in range(n)]
    return merge_rollouts([shard.result() for shard in shards])


@flow(name="webrl-bootstrap", log_prints=True)
def webrl_bootstrap(config: str = "demo", run_dir: str | None = None, overrides: list[str] | None = None) -> dict:
    """Phase 0 for the embedded default (or existing SFT/ORM checkpoints for real models)."""
    with open_run(config, overrides, run_dir, "bootstrap", "webrl-bootstrap") as run:
        boot, metrics = run.settings.bootstrap, {}
        test_set = run(task_sets.test_task_set)
        settings = run.settings
        if settings.bootstrap_from_checkpoints():  # a real model: SFT on its data, or an SFT checkpoint as is
            if boot.sft_data:
                actor, sft_metrics = run(bootstrap.sft_from_data, ArtifactRef.of(settings.models.actor, "model"),
                                         ArtifactRef.of(boot.sft_data))
                metrics.update({f"sft_{k}": v for k, v in sft_metrics.items()})
            else:
                actor = run(bootstrap.adopt_actor, ArtifactRef.of(boot.sft_actor, "model"))
            orm = ArtifactRef.of(settings.models.orm, "model")
            if settings.curriculum.seed_tasks:  # the SFT actor on the original training tasks: phase 1's failures
                seeds = run(task_sets.seed_task_set, ArtifactRef.of(settings.curriculum.seed_tasks))
                seed_rollouts = rollout(run, 0, "bootstrap", seeds, actor, settings.policy.temperature)
                seed_labels = run(experience.label_with_env, seed_rollouts)
                metrics.update(seed_rollout_success_rate=seed_labels["success_rate"],
                               seed_rollout_episodes=seed_labels["n"], seed_rollout_unscored=seed_labels["unscored"])
            else:
                get_run_logger().warning("curriculum.seed_tasks is empty: phase 1 will have no failures to evolve "
                                         "new tasks from and will stop; give a WebArena-Lite-format task file")
        else:
            demo_tasks = run(task_sets.train_task_pool, boot.demo_tasks, 1, "demo_tasks")
            demos = rollout(run, 0, "oracle", demo_tasks, None, 0.0)
            metrics["oracle_success_rate"] = run(experience.label_with_env, demos)["success_rate"]
            if boot.sft_actor:  # a checkpoint (say one `webrl bench sft-curve` trained) in the SFT stage's place
                actor = run(bootstrap.adopt_actor, ArtifactRef.of(boot.sft_actor, "model"))
            else:
                if settings.models.actor:  # a pretrained LLM (the default: SmolLM2-135M-Instruct) is fine-tuned
                    init = ArtifactRef.of(settings.models.actor, "model")
                else:  # from scratch: a tokenizer of the run's own corpus and a small random model
                    init = run(bootstrap.init_embedded_actor, run(bootstrap.build_tokenizer, demos))
                actor, sft_metrics = run(bootstrap.sft_actor, init, demos)
                metrics.update({f"sft_{k}": v for k, v in sft_metrics.items()})
            sft_tasks = run(task_sets.train_task_pool, boot.rollout_tasks, 2, "sft_rollout_tasks")
            sft_rollouts = rollout(run, 0, "bootstrap", sft_tasks, actor, run.settings.policy.temperature)
            metrics["sft_rollout_success_rate"] = run(experience.label_with_env, sft_rollouts)["success_rate"]
            labelled = [demos, sft_rollouts]
            if boot.random_tasks:
                random_tasks = run(task_sets.train_task_pool, boot.random_tasks, 3, "random_tasks")
                random_rollouts = rollout(run, 0, "random", random_tasks, None, 1.0)
                run(experience.label_with_env, random_rollouts)
                labelled.append(random_rollouts)
            if boot.early_exit_tasks:  # the first demonstrated tasks again, by the oracle that quits early
                early_tasks = run(task_sets.train_task_pool, boot.early_exit_tasks, 1, "early_exit_tasks")
                early_rollouts = rollout(run, 0, "early-exit", early_tasks, None, 0.0)
                metrics["early_exit_success_rate"] = run(experience.label_with_env, early_rollouts)["success_rate"]
                labelled.append(early_rollouts)
            orm, orm_metrics = run(bootstrap.train_orm, labelled, actor)
            metrics.update(orm_metrics)
        critic = run(bootstrap.init_critic, actor)
        eval_ref, eval_metrics = run(evaluation.evaluate, 0, actor, test_set)
        metrics.update(eval_metrics)
        with run.record(actor, orm, critic, eval_ref, metrics):
            tracking.log_metrics(metrics, step=0)
            create_markdown_artifact(report.publish_phase(run.run_dir, 0, metrics), key="webrl-phase-0",
                                     description="bootstrap summary")
        get_run_logger().info("bootstrap done: test success %.3f", eval_metrics["test_success_rate"])
        return {"actor": actor, "orm": orm, "critic": critic, "eval": eval_ref, "metrics": metrics}


@flow(name="webrl-phase", log_prints=True)
def webrl_phase(config: str = "demo", phase: int = 1, run_dir: str | None = None,
                overrides: list[str] | None = None) -> dict:
    """One WebRL phase k >= 1 (Algorithm 1's loop body); reads actor/critic of phase k-1 and its failed tasks."""
    with open_run(config, overrides, run_dir, "phase", f"webrl-phase-{phase}", phase=phase) as run:
        settings, k = run.settings, phase  # k: the phase, as in Algorithm 1
        with_critic = settings.actor.loss not in ActorTrainConfig.CRITIC_FREE
        actor_prev = run.model(k - 1, "actor")
        critic_prev = run.model(k - 1, "critic") if with_critic else None
        sft_actor = run.model(0, "actor")
        orm = ArtifactRef.of(settings.models.orm, "model") if settings.models.orm else run.model(0, "orm")
        test_set = run(task_sets.test_task_set)

        # 1. self-evolving curriculum: new tasks from phase k-1's failures, kept by the critic's value window (the
        # other recipes: tasks proposed from the sites' pages or drawn from the training pool; no value filter)
        failures_of = "bootstrap" if k == 1 else "rollout"
        failures_state = labelled_state(run.run_dir, k - 1, phase_policy_digest(settings, run.run_dir, k - 1))
        candidates, generation_stats = run(generation.generate_tasks, k, failures_of, rerun_when=failures_state)
        kept, filtering = run(generation.filter_tasks, k, candidates, critic_prev, with_critic and k > 1, orm)
        if settings.curriculum.human_review:
            kept = review_tasks(run.run_dir, k, kept, settings.curriculum.review_timeout_s,
                                settings.curriculum.review_default)
        tasks = run(task_sets.materialise_tasks, k, kept)

        # 2. experience: actor k-1 acts on the new tasks; the ORM (or the sites' evaluators, or a judge) labels them
        rollouts = rollout(run, k, "rollout", tasks, actor_prev, settings.policy.temperature,
                           settings.curriculum.rollouts_per_task)
        if settings.reward.source == "judge":  # PAE's autonomous evaluator
            labels = run(experience.judge_label, k, rollouts)
        else:
            labels = run(experience.orm_label, k, rollouts, orm)

        # 3. training data: the phase's transitions + perplexity-filtered replay of earlier successes
        samples, sample_stats = run(experience.phase_transitions, k, rollouts, rerun_when=labels)
        replay, replay_stats = run(experience.replay_transitions, k, actor_prev, samples)

        # 4. updates: critic first, then the actor against actor k-1 as the KL reference (a critic-free loss:
        # the actor alone, its advantages from the episodes' rewards)
        if with_critic:
            critic, critic_stats = run(updates.update_critic, k, samples, replay, sft_actor, critic_prev)
        else:
            critic, critic_stats = None, {}
            get_run_logger().info("phase %d: no critic stage (actor.loss=%s needs none)", k, settings.actor.loss)
        actor, actor_stats = run(updates.update_actor, k, samples, replay, actor_prev, critic)

        # 5. the new actor on the held-out test set
        eval_ref, eval_metrics = run(evaluation.evaluate, k, actor, test_set)

        n_tasks = len(read_json(tasks))
        wall_s = report.phase_wall_time(run.run_dir, k, actor.sha256[:12], time.time() - run.started)
        metrics = {"recipe": recipe_of(settings),
                   "critic_stage": "trained" if with_critic else f"none (actor.loss={settings.actor.loss} needs no critic)",
                   **generation_stats, **filtering, "kept_by_review": n_tasks,
                   # the curriculum's yield: the share of the phase's episodes on its kept tasks that the
                   # evaluators say actor k-1 solved (per task when curriculum.rollouts_per_task is 1)
                   "kept_solve_rate": labels["env_successes"] / max(1, rollouts["n"]),
                   "rollout_episodes": rollouts["n"], "rollout_errors": rollouts["errors"], **labels,
                   **sample_stats, **replay_stats, **{f"critic_{n}": v for n, v in critic_stats.items()},
                   **{f"actor_{n}": v for n, v in actor_stats.items()}, **eval_metrics,
                   "actor_digest": actor.sha256[:12], "phase_wall_s": wall_s}
        with run.record(actor, critic, eval_ref, metrics):
            tracking.log_metrics(metrics, step=k)
            create_markdown_artifact(report.publish_phase(run.run_dir, k, metrics, actor_ref=actor),
                                     key=f"webrl-phase-{k}", description=f"phase {k} summary")
        create_table_artifact(report.results_table(run.run_dir), key=f"webrl-success-phase-{k}",
                              description="test success per site")
        get_run_logger().info("phase %d done: test success %.3f", k, eval_metrics["test_success_rate"])
        return {"actor": actor, "critic": critic, "eval": eval_ref, "metrics": metrics}


@flow(name="webrl-train", log_prints=True)
def webrl_train(config: str = "demo", phases: int | None = None, run_dir: str | None = None,
                overrides: list[str] | None = None) -> dict:
    """Bootstrap (when needed) then N phases, each a sub-flow, nested under one MLflow run."""
    check_phase_count(phases)
    results = {}
    with open_run(config, overrides, run_dir, "train", "webrl-train", params={"phases": phases}) as run, \
            run.record():  # opened first: the phases' MLflow runs nest under it
        n = run.settings.run.phases if phases is None else phases
        results[0] = webrl_bootstrap(config, run.run_dir, overrides)
        for k in range(1, n + 1):
            results[k] = webrl_phase(config, k, run.run_dir, overrides)
        table = report.results_table(run.run_dir)
        tracking.log_artifact(report.write_summary(run.run_dir), "summary")
    return {"run_dir": run.run_dir, "table": table, "phases": {k: v["metrics"] for k, v in results.items()}}


@flow(name="webrl-eval", log_prints=True)
def webrl_eval(config: str = "demo", model: str = "", run_dir: str | None = None,
               overrides: list[str] | None = None, tag: int = 100) -> dict:
    """Evaluate a checkpoint (HF folder) on the test set; its episodes are stored as phase `tag` with purpose
    eval and keyed by the checkpoint's digest, the result in ``eval/model=<digest[:12]>.json``."""
    with open_run(config, overrides, run_dir, "eval", "webrl-eval", model=model, params={"tag": tag}) as run:
        if not model and run.settings.policy.backend == "hf":
            raise ValueError("webrl eval: --model names the HF checkpoint folder to evaluate (policy.backend=hf)")
        actor = ArtifactRef.of(model, "model") if model else None
        name = f"model={actor.sha256[:12]}" if actor else f"model={run.settings.policy.backend}"
        eval_ref, eval_metrics = run(evaluation.evaluate, tag, actor, run(task_sets.test_task_set), name)
        result = read_json(eval_ref)
        with run.record(eval_ref, eval_metrics):
            tracking.log_metrics({**eval_metrics, "policy_digest": result["policy_digest"]})
    return {"eval": result, "metrics": eval_metrics}
