"""The phase's model updates, in the paper's order (Algorithm 1): the critic first (on the phase's transitions
and the replay set), then the actor with the KL-constrained objective (paper Eq. 4-5) against the phase-start
actor as reference, its advantages from the new critic. Training itself is ``webrl_core.learn.critic_trainer`` and
``webrl_core.learn.webrl_trainer`` (the actor loss and its trainer), in-process or as an accelerate job
(``webrl_core.scale.launch``, section ``training``)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from webrl_core.scale import launch
from webrl_core.artifacts import ArtifactRef, read_jsonl
from webrl_core.pipeline.experience import numeric
from webrl_core.pipeline.stage import stage
from webrl_core.runs.rundir import output_key, publish, versioned


class NoTrainingData(RuntimeError):
    """A phase update has no samples: the phase would hand on the previous model as if it had trained it."""


def train_model(what: str, phase: int, out: Path, real: Path, samples: list[dict],
                train: Callable[[list[dict], Path], dict]) -> tuple[ArtifactRef, dict]:
    """Train into ``real`` and publish it as ``out``. With no samples (no labelled transitions, no replay) the
    phase fails: a model is never carried over as the phase's output."""
    if not samples:
        raise NoTrainingData(
            f"phase {phase}: the {what} update has 0 samples (no labelled transitions of this phase and no replay "
            f"of earlier successes); refusing to publish phase {phase - 1}'s {what} as phase {phase}'s. Check the "
            f"phase's rollouts (rollout_episodes, unscored) and, for phase 1, that phase 0 had seed rollouts "
            f"(curriculum.seed_tasks)")
    metrics = numeric(train(samples, real))
    if metrics.get("n_train") == 0:  # every sample masked out (the actor learns from positive advantages only)
        raise NoTrainingData(
            f"phase {phase}: the {what} update kept 0 of {len(samples)} samples (none with a positive advantage: no "
            f"success among the phase's episodes and no replayed success); refusing to publish phase {phase - 1}'s "
            f"{what} unchanged as phase {phase}'s")
    publish(out, real)
    return ArtifactRef.of(real, "model"), metrics


@stage("run", "models", "critic", "training")  # not "actor": a phase's actor.lr never retrains its critic
def update_critic(settings, run_dir: str, phase: int, samples_ref: ArtifactRef, replay_ref: ArtifactRef,
                  backbone_ref: ArtifactRef, prev_critic_ref: ArtifactRef) -> tuple[ArtifactRef, dict]:
    """Critic k from critic k-1 on the phase's transitions and (``critic.replay``, the official buffer) the replay
    set."""
    out = Path(run_dir) / "models" / f"phase={phase}" / "critic"
    real = versioned(out, output_key(settings, samples_ref, replay_ref, backbone_ref, prev_critic_ref))
    replayed = read_jsonl(replay_ref) if settings.critic.replay else []
    return train_model(
        "critic", phase, out, real, read_jsonl(samples_ref) + replayed,
        lambda samples, dst: launch.train_critic(samples, backbone_ref.path, dst, settings,
                                                 resume=prev_critic_ref.path))


@stage("run", "models", "actor", "critic", "training", "policy.max_new_tokens")  # dr_grpo divides by it
def update_actor(settings, run_dir: str, phase: int, samples_ref: ArtifactRef, replay_ref: ArtifactRef,
                 actor_ref: ArtifactRef, critic_ref: ArtifactRef | None) -> tuple[ArtifactRef, dict]:
    """Actor k from actor k-1 (also the KL reference) with advantages from critic k; a critic-free loss
    (``actor.loss`` grpo or filtered_bc) takes ``critic_ref=None`` and its advantages from the episodes' rewards."""
    out = Path(run_dir) / "models" / f"phase={phase}" / "actor"
    real = versioned(out, output_key(settings, samples_ref, replay_ref, actor_ref, critic_ref))
    critic_dir = critic_ref.path if critic_ref is not None else None
    return train_model(
        "actor", phase, out, real, read_jsonl(samples_ref) + read_jsonl(replay_ref),
        lambda samples, dst: launch.train_actor(samples, actor_ref.path, dst, settings, critic_dir=critic_dir))
