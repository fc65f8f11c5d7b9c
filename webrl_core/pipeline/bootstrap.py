"""Phase 0 on the embedded sites: the SFT actor (the pretrained ``models.actor``, or a from-scratch model on a
byte-level BPE tokenizer of the run's own corpus, fine-tuned on successful oracle demonstrations), the outcome
reward model (SFT of the actor's backbone on (ORM prompt, YES/NO) pairs labelled by the sites' evaluators,
paper Sec. 3.2) and the critic (the SFT backbone with fresh value heads, trained from phase 1 on). With a
pretrained model the user names the SFT actor and the ORM instead (``bootstrap.sft_actor``, ``models.orm``)."""

from __future__ import annotations

import json
import random
from pathlib import Path

from webrl_core.scale import launch
from webrl_core.artifacts import ArtifactRef
from webrl_core.learn.critic import Critic
from webrl_core.learn.sft_augment import sft_passes
from webrl_core.learn.embedded_model import build_embedded_model, train_embedded_tokenizer
from webrl_core.learn.orm import OrmScorer, evaluate_orm, orm_examples_from_episodes, split_examples
from webrl_core.pipeline.experience import numeric
from webrl_core.pipeline.stage import stage
from webrl_core.prompts import build_orm_prompt, prompt_format
from webrl_core.learn.sft_data import demonstration_episodes, read_demonstrations
from webrl_core.sites.data import entity_names
from webrl_core.runs.rundir import output_key, publish, versioned
from webrl_core.runs.store import TrajectoryStore
from webrl_core.websites import is_success


@stage("models", "orm", "prompt", "sites")
def build_tokenizer(settings, run_dir: str, demos: dict) -> ArtifactRef:
    """Byte-level BPE on the run's own corpus: demo prompts/actions and ORM prompts; with
    ``models.embedded.entity_tokens`` the embedded sites' entity names are whole tokens."""
    eps, by_ep = TrajectoryStore(run_dir).finished_episodes(demos["episode_ids"])
    texts, fmt = [], prompt_format(settings)
    for e in eps:
        steps = by_ep.get(e["episode_id"], [])
        texts += [s["prompt"] + s["response"] for s in steps]
        if steps:
            texts.append(build_orm_prompt(e["intent"], [s["response"] for s in steps], steps[-1]["html"] or "",
                                          settings.orm.max_html_chars, compat=fmt) + "YES NO")
    out = Path(run_dir) / "models" / "tokenizer"
    real = versioned(out, output_key(settings, json.dumps(demos["episode_ids"])))
    entities = entity_names(settings.sites.data_seed) if settings.models.embedded.entity_tokens else []
    train_embedded_tokenizer(texts, settings.models.embedded.vocab_size, real, whole_tokens=entities)
    publish(out, real)
    return ArtifactRef.of(real, "model")


@stage("models", "run")
def init_embedded_actor(settings, run_dir: str, tokenizer_ref: ArtifactRef) -> ArtifactRef:
    """The from-scratch embedded model (``models.embedded``, random weights) on the run's own tokenizer."""
    base = versioned(Path(run_dir) / "models" / "phase=0" / "init", output_key(settings, tokenizer_ref))
    build_embedded_model(tokenizer_ref.path, settings.models.embedded, base, seed=settings.run.seed)
    return ArtifactRef.of(base, "model")


SFT_ACTOR_FIELDS = ("actor.batch_size", "actor.grad_accum", "actor.micro_batch_size", "actor.max_grad_norm")
"""What the SFT reads of the ``actor`` section: the batch shape and clipping of the model it trains (its LR and
epochs are ``bootstrap.sft_*``), so a phase's ``actor.lr`` or ``actor.epochs`` never retrains phase 0."""


# prompt: the list shuffle reads the page in prompt.observation's layout
@stage("run", "models", "bootstrap", *SFT_ACTOR_FIELDS, "training", "sites", "prompt")
def sft_actor(settings, run_dir: str, init_ref: ArtifactRef, demos: dict) -> tuple[ArtifactRef, dict]:
    """Fine-tune the initial actor (the pretrained ``models.actor``, or the from-scratch embedded model) on the
    successful oracle demonstrations. With ``bootstrap.sft_entity_swap`` each epoch is its own entity-swapped pass
    over the pairs."""
    eps, by_ep = TrajectoryStore(run_dir).finished_episodes(demos["episode_ids"])
    pairs = [(s["prompt"], s["response"]) for e in eps if is_success(e.get("env_score"))
             for s in by_ep.get(e["episode_id"], [])]
    out = Path(run_dir) / "models" / "phase=0" / "actor"
    real = versioned(out, output_key(settings, init_ref, json.dumps(demos["episode_ids"])))
    pairs, epochs = sft_passes(settings, pairs)
    metrics = launch.sft_train(pairs, init_ref.path, real, settings, epochs=epochs)
    publish(out, real)
    return ArtifactRef.of(real, "model"), {"sft_pairs": len(pairs), **numeric(metrics)}


@stage()
def adopt_actor(run_dir: str, actor_ref: ArtifactRef) -> ArtifactRef:
    """An existing SFT checkpoint (``bootstrap.sft_actor``) published as the run's phase-0 actor: a link, so the
    phases find it where they find a trained one and its identity stays the folder's content digest."""
    out = Path(run_dir) / "models" / "phase=0" / "actor"
    out.parent.mkdir(parents=True, exist_ok=True)
    publish(out, Path(actor_ref.path))
    ref = ArtifactRef.of(out, "model")
    if ref.sha256 != actor_ref.sha256:
        raise RuntimeError(f"bootstrap.sft_actor {actor_ref.path} changed while it was adopted; run again")
    return ref


@stage("run", "models", "bootstrap", *SFT_ACTOR_FIELDS, "training", "prompt")
def sft_from_data(settings, run_dir: str, base_ref: ArtifactRef, data_ref: ArtifactRef) -> tuple[ArtifactRef, dict]:
    """Phase 0 of a real model: fine-tune the base ``models.actor`` on the demonstrations ``bootstrap.sft_data``
    (the official ShareGPT SFT file or VAB traces, ``webrl_core.learn.sft_data``), completion-only loss. The
    demonstrations also enter the store as phase-0 experience: the first phases replay them, as the official code
    replays the SFT data."""
    pairs = read_demonstrations(data_ref.path, settings.prompt.compat)
    TrajectoryStore(run_dir).write_episodes(demonstration_episodes(data_ref.path, data_ref.sha256,
                                                                   settings.prompt.compat))
    out = Path(run_dir) / "models" / "phase=0" / "actor"
    real = versioned(out, output_key(settings, base_ref, data_ref))
    metrics = launch.sft_train(pairs, base_ref.path, real, settings)
    publish(out, real)
    return ArtifactRef.of(real, "model"), {"sft_pairs": len(pairs), **numeric(metrics)}


@stage("run", "models", "orm", "training", "prompt")
def train_orm(settings, run_dir: str, rollouts: list[dict], base_ref: ArtifactRef) -> tuple[ArtifactRef, dict]:
    """ORM = SFT of the actor's backbone on (ORM prompt, YES/NO) labelled by the sites' evaluators; accuracy on a
    held-out share of the examples."""
    ids = sorted({i for r in rollouts for i in r["episode_ids"]})
    eps, by_ep = TrajectoryStore(run_dir).finished_episodes(ids)
    labels = {e["episode_id"]: is_success(e.get("env_score")) for e in eps}
    examples = orm_examples_from_episodes(eps, by_ep, labels, settings.orm.max_html_chars,
                                          compat=prompt_format(settings))
    fillers = {e["episode_id"] for e in eps if e.get("purpose") == "oracle"} \
        if settings.orm.positives == "policy_first" else set()
    examples = balance_classes(examples, seed=settings.run.seed, fill_only=fillers)
    train, held = split_examples(examples, settings.orm.eval_fraction, seed=settings.run.seed)
    out = Path(run_dir) / "models" / "phase=0" / "orm"
    real = versioned(out, output_key(settings, base_ref, json.dumps(ids)))
    launch.train_orm(train, base_ref.path, real, settings.orm, settings.models, seed=settings.run.seed,
                     training=settings.training)
    publish(out, real)
    metrics = evaluate_orm(OrmScorer(real, settings.orm, settings.models), held) if held else {}
    metrics = {f"orm_heldout_{k}": v for k, v in numeric(metrics).items()}
    metrics.update(orm_train_examples=len(train), orm_heldout_examples=len(held),
                   orm_positive_share=sum(labels.values()) / max(1, len(labels)))
    return ArtifactRef.of(real, "model"), metrics


def balance_classes(examples: list[dict], seed: int, fill_only: set[str] = frozenset()) -> list[dict]:
    """Subsample the majority label so YES and NO are equally frequent: with the oracle demos the raw data is
    mostly YES, and an ORM trained on it learns the prior (P(YES) above 0.5 for everything). Episodes in
    ``fill_only`` (the oracle's, with ``orm.positives: policy_first``) are drawn only once the others of their
    label are used up: an ORM whose YES examples are all demonstrations learns who acted, not what was done."""
    rng = random.Random(seed)
    yes = [e for e in examples if e["completion"] == "YES"]
    no = [e for e in examples if e["completion"] != "YES"]
    n = min(len(yes), len(no))
    if n == 0:
        return examples

    def draw(items: list[dict]) -> list[dict]:
        first = [e for e in items if e["episode_id"] not in fill_only]
        rest = [e for e in items if e["episode_id"] in fill_only]
        if len(first) >= n:
            return rng.sample(first, n)
        return first + rng.sample(rest, n - len(first))

    return sorted(draw(yes) + draw(no), key=lambda e: e["episode_id"])


@stage("run", "models", "critic")
def init_critic(settings, run_dir: str, actor_ref: ArtifactRef) -> ArtifactRef:
    """Critic = SFT backbone + two fresh heads (trained from phase 1 on)."""
    out = Path(run_dir) / "models" / "phase=0" / "critic"
    real = versioned(out, output_key(settings, actor_ref))
    Critic.from_backbone(actor_ref.path, head_init_std=settings.critic.head_init_std,
                         max_length=settings.models.max_length, dtype=settings.models.dtype,
                         device=settings.models.device, seed=settings.run.seed).save(real)
    publish(out, real)
    return ArtifactRef.of(real, "model")
