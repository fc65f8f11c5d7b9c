"""The settings schema: ``WebRLSettings``, the whole resolved config, over its sections (``config_sections``).

Every field has a default and a one-line description (``Field(description=...)``); unknown keys, wrong types and
missing paths are validation errors. The sections of where the stages run (``TrainingConfig``: in-process or
``accelerate launch``; ``RolloutConfig``: local or Ray) are defined here, the others in ``config_sections``.
Renamed fields (``RENAMED``) are migrated here, with a deprecation warning, wherever a config mapping is validated. Also the names of the files ``webrl webarena local-setup`` writes for the
fields they feed (``LOCAL_INPUT_FILES``) and the serving engines' default commands (``SERVING_COMMANDS``).

Reading YAML files, ``--set`` overrides and the URL environment variables into a ``WebRLSettings``
(``load_config``), and the error messages, are ``webrl_core.config_loader``'s.
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from webrl_core.config_sections import (PATH_MISSING, REPO_ROOT, SERVING_COMMANDS, ActorTrainConfig, BootstrapConfig,
                                        CriticConfig, CurriculumConfig, EmbeddedModelConfig, EnvConfig, EvalConfig,
                                        LoraConfig, ModelsConfig, OrmConfig, PolicyConfig, PromptConfig,
                                        ReplayConfig, RewardConfig, RunConfig, Section, ServingConfig, SitesConfig,
                                        TrackingConfig, TransitionsConfig)
from webrl_core.prompts import check_screenshot_input

__all__ = ["WebRLSettings", "RENAMED", "migrate_renamed", "LOCAL_INPUT_FILES", "LOCAL_INPUTS_DIR", "PATH_MISSING",
           "REPO_ROOT", "SERVING_COMMANDS", "ActorTrainConfig", "BootstrapConfig", "CriticConfig", "CurriculumConfig",
           "EmbeddedModelConfig", "EnvConfig", "EvalConfig", "LoraConfig", "ModelsConfig", "OrmConfig",
           "PolicyConfig", "PromptConfig", "ReplayConfig", "RewardConfig", "RolloutConfig", "RunConfig", "Section",
           "ServingConfig", "SitesConfig", "TrackingConfig", "TrainingConfig", "TransitionsConfig",
           "accelerate_config_names", "accelerate_config_path"]

log = logging.getLogger(__name__)

RENAMED: dict[str, str] = {
    "critic.filter_low": "curriculum.filter_low",
    "critic.filter_high": "curriculum.filter_high",
    "actor.gamma": "transitions.gamma",
    "actor.sft_lr": "bootstrap.sft_lr",
    "actor.sft_epochs": "bootstrap.sft_epochs",
    "actor.sft_loss": "bootstrap.sft_loss",
    "eval.fuzzy_judge_url": "eval.judge",
    "eval.fuzzy_judge_model": "eval.judge_model",
}
"""Old dotted field name -> new one. The old names are accepted, with a deprecation warning, until the next
release; then this table goes."""


LOCAL_INPUT_FILES = {"base_model": "base-model", "orm": "orm-model", "sft_data": "sft_demos.sharegpt.json",
                     "seed_tasks": "seed_tasks.raw.json", "test_set": "test_tasks.raw.json"}
"""What ``webrl webarena local-setup`` (``pipeline.local_webarena.prepare_local_inputs``) writes, by the config field
it feeds (``configs/webarena-local.yaml``)."""
LOCAL_INPUTS_DIR = "runs/webarena-local-inputs"
"""Where ``webrl webarena local-setup`` writes them unless told otherwise (the paths webarena-local.yaml reads)."""


ACCELERATE_CONFIGS = REPO_ROOT / "infra" / "accelerate"


def accelerate_config_names() -> list[str]:
    return sorted(p.stem for p in ACCELERATE_CONFIGS.glob("*.yaml"))


def accelerate_config_path(name: str) -> Path:
    """A name in infra/accelerate/ (with or without .yaml) or an existing file path."""
    p = Path(os.path.expanduser(name))
    if p.is_file():
        return p.resolve()
    cand = ACCELERATE_CONFIGS / (name if name.endswith((".yaml", ".yml")) else f"{name}.yaml")
    if cand.is_file():
        return cand
    raise ValueError(f"accelerate config {name!r} is neither a file nor one of {accelerate_config_names()} "
                     f"in {ACCELERATE_CONFIGS}")


class TrainingConfig(Section):
    """How the training stages run: in the flow's process, or as `accelerate launch` jobs (webrl_core.scale.launch)."""

    launcher: Literal["inprocess", "accelerate"] = Field(
        "inprocess", description="inprocess: train in the flow's process; accelerate: run each training stage "
        "(critic, actor, SFT, ORM) as an `accelerate launch` job of num_processes ranks")
    accelerate_config: str = Field(
        "ddp", description="accelerate config: a name in infra/accelerate/ (ddp, fsdp, deepspeed_zero3) or a path "
        "to an accelerate config YAML")
    num_processes: int = Field(2, ge=1, description="ranks of an accelerate job (GPUs; processes on CPU)")
    python: str | None = Field(
        None, description="interpreter that runs `accelerate launch` and the ranks (needs webrl, accelerate); "
        "empty: the flow's own (sys.executable)")
    extra_args: list[str] = Field(
        default_factory=list, description="more `accelerate launch` arguments, e.g. [--num_machines, '2', "
        "--machine_rank, '0', --main_process_ip, 10.0.0.1]; a free --main_process_port is picked unless given")

    @model_validator(mode="after")
    def _config_exists(self) -> TrainingConfig:
        if self.launcher == "accelerate":
            accelerate_config_path(self.accelerate_config)
        return self


class RolloutConfig(Section):
    """Where rollouts run: in the stage's process, or as shards on a Ray cluster (``webrl_core.scale.ray_rollout``)."""

    engine: Literal["local", "ray"] = Field(
        "local", description="local: the stage's process runs every episode; ray: shards of episodes run as Ray "
        "tasks across a Ray cluster (webrl_core.scale.ray_rollout)")
    ray_address: str | None = Field(
        None, description="Ray cluster to join (host:port of the head's GCS, 'auto' for the cluster `ray start` "
        "made on this machine, or ray://host:10001); null: the RAY_ADDRESS env var, else a local cluster is "
        "started for the rollout and stopped after it")
    shard_size: int = Field(8, ge=1, description="episodes per Ray task; each task starts its own sites server and "
                            "browser pool (smaller: better balance and less re-run work after a failure, more "
                            "start-up cost)")
    retries: int = Field(3, ge=0, description="times Ray re-runs a shard whose worker or node died (max_retries); "
                         "finished episodes are kept, only the unfinished ones run again")
    cpus_per_shard: float = Field(1.0, gt=0, description="Ray CPUs a shard reserves (a node runs at most "
                                  "num_cpus / cpus_per_shard shards at once, each with env.n_envs browsers)")
    policy_serving: Literal["shared", "per_shard"] = Field(
        "shared", description="policy.backend=hf: shared serves the checkpoint once from the driver as an "
        "OpenAI-compatible endpoint every shard calls; per_shard loads a model copy in every shard (the "
        "checkpoint path must exist on every node). Other backends ignore it")
    policy_host: str = Field(
        "127.0.0.1", description="interface the shared policy server binds and the shards call; loopback serves "
        "only shards on the driver's machine: set the driver's IP for a multi-machine cluster")


class WebRLSettings(Section):
    """The whole resolved config."""

    run: RunConfig = Field(default_factory=RunConfig, description="run identity and seed")
    sites: SitesConfig = Field(default_factory=SitesConfig, description="which websites the agent acts in")
    env: EnvConfig = Field(default_factory=EnvConfig, description="browser environment")
    prompt: PromptConfig = Field(default_factory=PromptConfig, description="prompt format")
    models: ModelsConfig = Field(default_factory=ModelsConfig, description="model folders and sizes")
    policy: PolicyConfig = Field(default_factory=PolicyConfig, description="how actions are generated")
    serving: ServingConfig = Field(default_factory=ServingConfig, description="the server that serves each phase's "
                                   "actor for policy.backend=openai (vLLM, SGLang, the project's own, or external)")
    orm: OrmConfig = Field(default_factory=OrmConfig, description="outcome reward model")
    reward: RewardConfig = Field(default_factory=RewardConfig, description="where episode outcome labels come from (ORM or the sites' evaluators)")
    critic: CriticConfig = Field(default_factory=CriticConfig, description="critic training")
    transitions: TransitionsConfig = Field(default_factory=TransitionsConfig,
                                           description="step samples (and their MC returns) from episodes")
    replay: ReplayConfig = Field(default_factory=ReplayConfig, description="perplexity replay selection")
    actor: ActorTrainConfig = Field(default_factory=ActorTrainConfig, description="KL-constrained actor update")
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig,
                                         description="self-evolving task generation and its critic filter")
    bootstrap: BootstrapConfig = Field(default_factory=BootstrapConfig, description="phase 0: demos, SFT, ORM data")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="test-set evaluation")
    tracking: TrackingConfig = Field(default_factory=TrackingConfig, description="MLflow tracking")
    training: TrainingConfig = Field(default_factory=TrainingConfig, description="where training stages run "
                                     "(in-process or accelerate launch: DDP, FSDP, DeepSpeed ZeRO-3)")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="where rollouts run (local or a "
                                   "Ray cluster)")

    @model_validator(mode="before")
    @classmethod
    def _renamed_fields(cls, data: Any) -> Any:
        """Old names (``RENAMED``) -> new ones, with a warning; and, for one release, the curriculum's API key
        env var follows ``policy.api_key_env`` when only that one is set (the curriculum used to read it)."""
        if not isinstance(data, dict):
            return data
        data = migrate_renamed(data)
        policy, cur = data.get("policy"), data.get("curriculum")
        if (isinstance(policy, dict) and "api_key_env" in policy and isinstance(cur, dict)
                and cur.get("generator") == "openai" and "api_key_env" not in cur):
            _deprecated(f"the curriculum's generator now reads 'curriculum.api_key_env', not 'policy.api_key_env': "
                        f"using policy.api_key_env={policy['api_key_env']!r} for it; set curriculum.api_key_env")
            data["curriculum"] = {**cur, "api_key_env": policy["api_key_env"]}
        return data

    @model_validator(mode="after")
    def _entity_levers_need_embedded_sites(self) -> WebRLSettings:
        """The entity levers read the embedded sites' names: refused at load time on real WebArena."""
        if self.sites.mode != "embedded":
            for field, on in (("models.embedded.entity_tokens", self.models.embedded.entity_tokens),
                              ("bootstrap.sft_entity_swap", self.bootstrap.sft_entity_swap > 0)):
                if on:
                    raise ValueError(f"{field} uses the embedded sites' entity names; sites.mode is "
                                     f"{self.sites.mode!r} (turn {field} off for real WebArena)")
        return self

    @model_validator(mode="after")
    def _list_shuffle_needs_compact_lines(self) -> WebRLSettings:
        """The list shuffle reads the compact page's list lines: the HTML observation has none to move."""
        if self.bootstrap.sft_list_shuffle > 0 and not self.prompt.observation.startswith("compact"):
            raise ValueError(f"bootstrap.sft_list_shuffle={self.bootstrap.sft_list_shuffle} permutes the compact "
                             f"page's list lines; prompt.observation is {self.prompt.observation!r} (set "
                             f"prompt.observation: compact or compact_id_after, or bootstrap.sft_list_shuffle: 0)")
        return self

    def check_combinations(self) -> WebRLSettings:
        """The other recipes' knobs need their counterparts in other sections: GRPO a group per task, the judge
        reward a judge, PAE's LLM-proposed tasks (which carry no evaluator) a reward that does not come from the
        evaluators, and a screenshot observation a policy that takes images (an OpenAI-compatible chat endpoint).
        ValueError naming the fields. Not a validator: a stage rebuilds the settings from the sections it declares,
        the others at their defaults, which would fail these checks; ``load_config`` runs it on the whole config."""
        if self.actor.loss == "grpo" and self.curriculum.rollouts_per_task < 2:
            raise ValueError("actor.loss=grpo normalises each episode's reward within its task's group: set "
                             "curriculum.rollouts_per_task >= 2 (it is 1: every advantage would be 0)")
        reward = self.reward
        if reward.source == "judge" and not reward.judge:
            raise ValueError("reward.source=judge needs reward.judge: an OpenAI-compatible endpoint "
                             "(http://127.0.0.1:8000/v1) or a local model (smollm2-135m-instruct)")
        if reward.judge_screenshots and not self.env.screenshots:
            raise ValueError(f"reward.judge_screenshots={reward.judge_screenshots} sends the episode's last "
                             f"screenshots to the judge: set env.screenshots: true to take them")
        check_screenshot_input(self.prompt.observation, self.policy.backend, self.prompt.style)
        cur = self.curriculum
        llm_proposer = cur.generator == "propose" and (cur.base_url or cur.hf_model)
        if llm_proposer and reward.source == "env":
            raise ValueError("curriculum.generator=propose with an LLM (curriculum.base_url / hf_model) writes tasks "
                             "the sites' evaluators cannot score: set reward.source to judge (or orm)")
        return self

    def run_dir(self) -> Path:
        return Path(self.run.root) / self.run.name

    def bootstrap_from_checkpoints(self) -> bool:
        """Phase 0 of a real model: SFT on ``bootstrap.sft_data``, or ``bootstrap.sft_actor`` with its seed tasks
        (or off the embedded sites), the ORM named by ``models.orm``. Otherwise the embedded bootstrap runs, with
        ``bootstrap.sft_actor`` (when set) in its SFT stage's place."""
        b = self.bootstrap
        return bool(b.sft_data or (b.sft_actor and (self.curriculum.seed_tasks or self.sites.mode != "embedded")))


def _deprecated(message: str) -> None:
    warnings.warn(message, DeprecationWarning, stacklevel=3)
    log.warning(message)  # DeprecationWarning is hidden outside __main__ by default; the log line is not


def migrate_renamed(data: dict, source: str = "config") -> dict:
    """``data`` (a config mapping) with every old name of ``RENAMED`` moved to its new name, each with a
    deprecation warning. Giving both names with different values is an error. The input is not modified."""
    out = dict(data)
    for old, new in RENAMED.items():
        old_section, old_key = old.split(".")
        section = out.get(old_section)
        if not isinstance(section, dict) or old_key not in section:
            continue
        new_section, new_key = new.split(".")
        if not isinstance(out.get(new_section, {}), dict):
            continue  # not a mapping: validation reports it
        section = dict(section)
        value = section.pop(old_key)
        # read after the pop: a field renamed within its own section must not keep its old key
        target = section if new_section == old_section else out.get(new_section, {})
        if new_key in target and target[new_key] != value:
            raise ValueError(f"{source}: both {old!r} (deprecated) and {new!r} are set, to {value!r} and "
                             f"{target[new_key]!r}; keep only {new!r}")
        _deprecated(f"{source}: config field {old!r} is deprecated, use {new!r} (the old name is accepted until "
                    f"the next release)")
        out[old_section] = section
        out[new_section] = {**target, new_key: value}
    return out
