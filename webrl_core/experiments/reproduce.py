"""Re-run a recorded phase from its artifacts and report whether the outputs match.

Inputs come from the run directory: ``config.yaml`` (the resolved config, seeds included), the store
(trajectories and their ORM labels), ``models/phase=k-1`` (phase-start actor and critic) and
``models/phase=0/actor`` (critic backbone). Without ``redo_rollouts`` the phase's data stages are
re-computed from the stored trajectories: transitions -> replay selection -> critic -> actor, into
``<run_dir>/reproduce/phase=k``; each output is compared with the recorded one by sha256 (datasets) and by
the largest absolute weight difference (models). With ``redo_rollouts`` the phase's tasks are rolled out
again with the phase-start actor and the success rates are compared as well. A recipe without a critic
(``actor.loss`` grpo or filtered_bc) has no critic to re-train or compare; a judge-labelled one
(``reward.source: judge``) is labelled again by its judge.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from webrl_core.artifacts import ArtifactRef, read_json, sha256_path
from webrl_core.config import ActorTrainConfig
from webrl_core.config_loader import load_config
from webrl_core.errors import BadInput, MissingInput
from webrl_core.runs.rundir import model_ref
from webrl_core.runs.store import TrajectoryStore
from webrl_core.websites import SUCCESS_THRESHOLD


def _link(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.is_symlink() or dst.exists():
        if dst.is_symlink():
            dst.unlink()
        else:
            shutil.rmtree(dst)
    os.symlink(src.resolve(), dst)


def max_weight_diff(a: str | Path, b: str | Path) -> float:
    from safetensors.torch import load_file

    fa = sorted(Path(a).glob("*.safetensors"))
    fb = {p.name: p for p in Path(b).glob("*.safetensors")}
    worst = 0.0
    for f in fa:
        ta, tb = load_file(str(f)), load_file(str(fb[f.name]))
        for k, v in ta.items():
            worst = max(worst, float((v.float() - tb[k].float()).abs().max()))
    return worst


def recorded_outputs(run: Path, phase: int, with_critic: bool = True) -> dict[str, Path]:
    """The outputs of a finished phase that a reproduction compares against (no critic for a critic-free loss)."""
    out = {"samples": run / "data" / f"phase={phase}" / "samples.jsonl",
           "replay": run / "data" / f"phase={phase}" / "replay.jsonl",
           "critic": run / "models" / f"phase={phase}" / "critic",
           "actor": run / "models" / f"phase={phase}" / "actor"}
    if not with_critic:
        del out["critic"]
    return out


def has_critic(settings) -> bool:
    """Whether the recipe trains a critic (every WebRL loss does; GRPO and filtered BC do not)."""
    return settings.actor.loss not in ActorTrainConfig.CRITIC_FREE


def check_reproducible(run_dir: str | Path, phase: int) -> Path:
    """The run dir is a run's (its ``config.yaml``) and recorded phase ``phase`` >= 1; checked before anything is
    written. Returns the resolved run dir."""
    run = Path(run_dir).resolve()
    if phase < 1:
        raise BadInput(f"--phase {phase}: reproduce works on phases >= 1 (the bootstrap is re-run by webrl bootstrap)")
    if not run.is_dir():
        raise MissingInput(f"{run_dir}: no such run directory (give the run dir of a finished run, e.g. runs/demo)")
    if not (run / "config.yaml").is_file():
        raise MissingInput(f"{run_dir}: not a run directory (no config.yaml in it)")
    missing = [str(p) for p in recorded_outputs(run, phase, has_critic(load_config(run / "config.yaml"))).values()
               if not p.exists()]
    if missing:
        raise MissingInput(f"{run_dir}: phase {phase} did not record {', '.join(missing)}; run it first (webrl phase "
                           f"--phase {phase} --run-dir {run_dir})")
    return run


def reproduce_phase(run_dir: str | Path, phase: int, redo_rollouts: bool = False) -> dict:
    from webrl_core.agent.rollout_policy import rollout_identity
    from webrl_core.env.rollout import default_attempts, plan_episode_ids
    from webrl_core.pipeline import experience, updates  # the stages (torch, transformers): after the checks

    run = check_reproducible(run_dir, phase)
    s = load_config(run / "config.yaml")
    out = run / "reproduce" / f"phase={phase}"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    _link(run / "store", out / "store")  # read-only use: these stages only read the store
    for k in sorted({0, phase - 1}):
        _link(run / "models" / f"phase={k}", out / "models" / f"phase={k}")
    rd = str(out)
    recorded = recorded_outputs(run, phase, has_critic(s))
    report: dict = {"phase": phase, "run_dir": str(run), "outputs": {}}
    tasks = read_json(run / "tasks" / f"phase={phase}" / "tasks.json")
    ident = rollout_identity(s, model_ref(run, phase - 1, "actor"), s.policy.temperature, "rollout")
    g = s.curriculum.rollouts_per_task  # each task's attempts 0..g-1, as the phase rolled them out
    every = [t for t in tasks for _ in range(g)]
    rolls = {"episode_ids": sorted(plan_episode_ids(every, phase=phase, purpose="rollout", seed=s.run.seed,
                                                    attempts=default_attempts(every), **ident))}
    if redo_rollouts:
        tasks_ref = ArtifactRef.of(run / "tasks" / f"phase={phase}" / "tasks.json")
        (out / "store").unlink()  # a fresh store for the new rollouts (the link pointed at the recorded one)
        prev = model_ref(rd, phase - 1, "actor")
        r = experience.rollout(s, rd, phase, "rollout", tasks_ref, prev, s.policy.temperature, samples_per_task=g)
        old = TrajectoryStore(run).sql(
            "SELECT avg(CASE WHEN env_score >= $t THEN 1.0 ELSE 0.0 END) AS r FROM episodes "
            "WHERE phase = $p AND purpose = 'rollout'", {"p": phase, "t": SUCCESS_THRESHOLD})[0]["r"]
        report["rollouts"] = {"recorded_env_success": old, "reproduced_env_success": r["env_success"] / max(1, r["n"])}
        if s.reward.source == "judge":
            experience.judge_label(s, rd, phase, r)
        else:
            experience.orm_label(s, rd, phase, r, ArtifactRef.of(run / "models" / "phase=0" / "orm"))
        rolls = r
    samples, _ = experience.phase_transitions(s, rd, phase, rolls)
    replay, _ = experience.replay_transitions(s, rd, phase, model_ref(rd, phase - 1, "actor"), samples)
    critic = None
    if has_critic(s):
        critic, _ = updates.update_critic(s, rd, phase, samples, replay, model_ref(rd, 0, "actor"),
                                         model_ref(rd, phase - 1, "critic"))
    actor, _ = updates.update_actor(s, rd, phase, samples, replay, model_ref(rd, phase - 1, "actor"), critic)
    for name, ref in (("samples", samples), ("replay", replay)):
        report["outputs"][name] = {"match": sha256_path(recorded[name]) == ref.sha256, "recorded": str(recorded[name]),
                                   "reproduced": ref.path}
    for name, ref in (("critic", critic), ("actor", actor)) if critic is not None else (("actor", actor),):
        diff = max_weight_diff(recorded[name], ref.path)
        report["outputs"][name] = {"match": diff == 0.0, "max_abs_weight_diff": diff, "recorded": str(recorded[name]),
                                   "reproduced": ref.path}
    report["all_match"] = all(v["match"] for v in report["outputs"].values())
    return report
