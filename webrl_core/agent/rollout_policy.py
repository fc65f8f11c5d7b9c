"""Which policy acts in a rollout, and its identity in the episode keys (``webrl_core.identity``).

Algorithm 1 of the WebRL paper: phase k's rollouts come from the actor of phase k-1 (the bootstrap's from the SFT
actor); evaluation uses the phase's output actor at the evaluation temperature. The policy's identity is
``hf:<checkpoint sha256>`` (in-process), ``<engine>:<served name>@hf:<checkpoint sha256>`` (an actor checkpoint
served by ``webrl_core.agent.serving``), ``openai:<model>@<served digest>`` (an endpoint without an actor checkpoint, e.g.
a hosted model evaluated on its own), ``oracle``, ``random:s<seed>`` or ``oracle-early-exit:s<seed>:p<p>``
(the oracle that quits early).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from webrl_core import identity
from webrl_core.artifacts import ArtifactRef
from webrl_core.env.judge import describe_judge
from webrl_core.env.scripted import RandomPolicy
from webrl_core.agent import grounding
from webrl_core.agent.policy import HFPolicy, OpenAIPolicy, served_model_digest
from webrl_core.runs.rundir import model_ref
from webrl_core.agent.serving import Endpoint, served_policy_digest
from webrl_core.prompts import check_screenshot_input, observes_screenshot, prompt_format
from webrl_core.sites.oracle import EarlyExitOraclePolicy, OraclePolicy


def backend_for(settings: Any, purpose: str) -> str:
    """The policy backend of a rollout: scripted purposes (oracle, random) name their own."""
    return purpose if purpose in identity.SCRIPTED_POLICIES else settings.policy.backend


def policy_digest_for(settings: Any, actor_ref: ArtifactRef | None, purpose: str) -> str:
    """The identity of the policy that acts in a ``purpose`` rollout with actor ``actor_ref``."""
    backend = backend_for(settings, purpose)
    if backend == "oracle":
        return "oracle"
    if backend == "random":
        return f"random:s{settings.run.seed}"
    if backend == "early-exit":
        return EarlyExitOraclePolicy(seed=settings.run.seed).policy_id
    if backend == "openai":
        if actor_ref is not None:  # the checkpoint, served for the stage (or by an endpoint that vouches for it)
            return served_policy_digest(settings.serving.engine, served_name(settings), actor_ref)
        pc = settings.policy
        return f"openai:{pc.model_name}@{served_model_digest(pc.base_url, pc.model_name, pc.api_key_env)}"
    if actor_ref is None:
        raise ValueError(f"policy.backend=hf needs an actor checkpoint for the {purpose!r} rollout; none was given")
    return f"hf:{actor_ref.sha256}"


def served_name(settings: Any) -> str:
    """The model name the actor is served under: ``policy.model_name`` for an external endpoint (when set), else
    ``serving.served_model_name``."""
    sv = settings.serving
    return (settings.policy.model_name or sv.served_model_name) if sv.engine == "external" else sv.served_model_name


def needs_server(settings: Any, actor_ref: ArtifactRef | None, purpose: str) -> bool:
    """Whether a rollout acts through a served copy of ``actor_ref`` (``webrl_core.agent.serving.served_actor``)."""
    return backend_for(settings, purpose) == "openai" and actor_ref is not None


def grounds_by_name(settings: Any, purpose: str) -> bool:
    """Whether a ``purpose`` rollout's model policy grounds its element ids by name (``policy.name_grounding``;
    scripted policies act as written)."""
    return backend_for(settings, purpose) not in identity.SCRIPTED_POLICIES and \
        grounding.applies(settings.policy.name_grounding, purpose)


def check_observation_input(settings: Any, actor_ref: ArtifactRef | None, purpose: str) -> None:
    """ValueError, before any server or browser starts, when the policy of a ``purpose`` rollout cannot be given
    ``prompt.observation``: a screenshot needs an OpenAI-compatible chat endpoint serving a vision-language model
    (``prompts.check_screenshot_input``); the project's own server (``serving.engine: webrl``) serves the actor
    checkpoint as a text-only model."""
    observation, backend = settings.prompt.observation, backend_for(settings, purpose)
    check_screenshot_input(observation, backend, settings.prompt.style)
    if observes_screenshot(observation) and needs_server(settings, actor_ref, purpose) \
            and settings.serving.engine == "webrl":
        raise ValueError(f"prompt.observation={observation!r} sends the step's screenshot as an image, but "
                         f"policy.backend='openai' with serving.engine='webrl' serves the actor checkpoint with the "
                         f"project's text-only HF server: serve a vision-language model with serving.engine: vllm "
                         f"(or external), or use a text observation")


def rollout_identity(settings: Any, actor_ref: ArtifactRef | None, temperature: float, purpose: str
                     ) -> dict[str, str]:
    """What acts in a rollout, as it enters the episode keys: the policy's identity and the digest of the
    sampling (model policies only) and env/site settings. A ``prompt.observation`` the policy cannot be given fails
    here (``check_observation_input``), before the stage serves a model or starts a browser."""
    check_observation_input(settings, actor_ref, purpose)
    sites = {"mode": settings.sites.mode, "data_seed": settings.sites.data_seed, "urls": settings.sites.urls}
    sampled = backend_for(settings, purpose) not in identity.SCRIPTED_POLICIES
    digest = identity.settings_digest(settings.env, temperature=temperature if sampled else None,
                                      policy_cfg=settings.policy, prompt_style=settings.prompt.style, sites=sites)
    # the prompt format and the judge change episodes too; folded in only when not the default, so the default
    # keeps its episode ids
    extra = {}
    fmt = prompt_format(settings)
    if fmt.key != "webrl":
        extra["prompt_compat"] = fmt.key
    if (settings.eval.judge or "").strip():
        extra["judge"] = describe_judge(settings)
    if grounds_by_name(settings, purpose):
        extra["name_grounding"] = True
    if extra:
        digest = identity.digest({"settings": digest, **extra})
    return {"policy_digest": policy_digest_for(settings, actor_ref, purpose), "settings_digest": digest}


def phase_policy_digest(settings: Any, run_dir: str | Path, phase: int) -> str:
    """Identity of the policy whose rollouts are phase ``phase``'s own experience in the current lineage: the
    SFT actor's bootstrap rollouts for phase 0, actor k-1's rollouts for phase k >= 1 (Algorithm 1). Episodes of
    the same phase by other policies (an earlier run before a knob changed an upstream model) are stale."""
    return policy_digest_for(settings, model_ref(run_dir, max(0, phase - 1), "actor"),
                             "bootstrap" if phase == 0 else "rollout")


def lineage(settings: Any, run_dir: str | Path, before_phase: int) -> list[str]:
    """``"<phase>|<policy digest>"`` of the experience phases < ``before_phase`` contribute to replay: the oracle's
    demonstrations and each phase's rollouts by the policy of the current lineage."""
    out = ["0|oracle"]
    for k in range(before_phase):
        try:
            out.append(f"{k}|{phase_policy_digest(settings, run_dir, k)}")
        except FileNotFoundError:  # a real-model run without bootstrap rollouts has no phase-0 actor of its own
            continue
    return out


def make_policy(settings: Any, actor_ref: ArtifactRef | None, temperature: float, purpose: str,
                endpoint: Endpoint | None = None):
    """The action policy of a rollout: oracle/random (scripted), in-process HF model, or an OpenAI-compatible server
    (``endpoint``: the served actor, required when there is an actor checkpoint; else ``policy.base_url``); a model
    policy grounds its element ids by name where ``policy.name_grounding`` says so (``agent.grounding``)."""
    check_observation_input(settings, actor_ref, purpose)
    policy = _model_or_scripted_policy(settings, actor_ref, temperature, purpose, endpoint)
    return grounding.NameGroundedPolicy(policy) if grounds_by_name(settings, purpose) else policy


def _model_or_scripted_policy(settings: Any, actor_ref: ArtifactRef | None, temperature: float, purpose: str,
                              endpoint: Endpoint | None):
    backend = backend_for(settings, purpose)
    if backend == "oracle":
        return OraclePolicy()
    if backend == "random":
        return RandomPolicy(seed=settings.run.seed)
    if backend == "early-exit":
        return EarlyExitOraclePolicy(seed=settings.run.seed)
    if backend == "openai":
        if actor_ref is not None and endpoint is None:
            raise ValueError(f"policy.backend=openai with the actor checkpoint {actor_ref.path}: the {purpose!r} "
                             f"rollout needs the endpoint serving it (webrl_core.agent.serving.served_actor)")
        if endpoint is not None:
            return OpenAIPolicy(endpoint.base_url, endpoint.model_name, cfg=settings.policy, temperature=temperature,
                                style=settings.prompt.style, compat=prompt_format(settings),
                                policy_id=f"{endpoint.policy_digest}@T{temperature:g}",
                                obs_budget=settings.env.obs_char_budget)
        return OpenAIPolicy(settings.policy.base_url, settings.policy.model_name, cfg=settings.policy,
                            temperature=temperature, style=settings.prompt.style, compat=prompt_format(settings),
                            obs_budget=settings.env.obs_char_budget)
    actor_dir = actor_ref.path
    return HFPolicy(actor_dir, settings.policy, settings.models, temperature=temperature,
                    policy_id=f"{Path(actor_dir).parent.name}/{Path(actor_dir).name}@T{temperature:g}",
                    style=settings.prompt.style, compat=prompt_format(settings),
                    obs_budget=settings.env.obs_char_budget)
