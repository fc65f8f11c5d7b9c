"""The config's sections (pydantic v2 models), each the settings of one part of the loop, and the constants their
validators read: the serving engines' default commands (``SERVING_COMMANDS``). Where the stages run (``training``,
``rollout``) is ``webrl_core.config``'s.

Every field has a default and a one-line description (``Field(description=...)``); unknown keys, wrong types and
missing paths are validation errors. ``webrl_core.config`` assembles them into ``WebRLSettings``, the whole config,
and is where the rest of the library imports them from.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from webrl_core.hardware import auto_dtype
from webrl_core.pretrained import ALIASES, KNOWN, resolve_model_ref, setup_command
from webrl_core.prompts import COMPATS, OBSERVATIONS, STYLES
from webrl_core.websites import ALL_SITES

REPO_ROOT = Path(__file__).resolve().parents[1]

PATH_MISSING = "path_missing"  # the pydantic error type of a configured path that does not exist



class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def _loopback_host(v: str) -> str:
    """Servers bind to loopback only."""
    if v not in ("127.0.0.1", "localhost", "::1"):
        raise ValueError(f"host {v!r} is not loopback; allowed: '127.0.0.1', 'localhost', '::1'")
    return v


def _existing_path(value: str | None) -> str | None:
    """The value of a path field, which must exist; a ``PATH_MISSING`` error (the message names the path) else."""
    if value in (None, ""):
        return None
    if "://" in str(value):  # a URL (an endpoint or a remote store) is not checked here
        return value
    if not Path(os.path.expanduser(value)).exists():
        raise PydanticCustomError(PATH_MISSING, "no such file or folder '{path}'", {"path": str(value)})
    return value


def _model_ref(v: str | None) -> str | None:
    """A model field's value: a known short name (``webrl models list``) becomes its cache folder, which must be
    made; anything else is a folder that must exist. A bare word that is neither is refused as an unknown name."""
    folder = resolve_model_ref(v)
    if folder and folder != v and not Path(folder).exists():
        raise ValueError(f"{v!r} names a pretrained model whose folder {folder} is not made yet: run "
                         f"`{setup_command(v)}`")
    if folder and "/" not in folder and os.sep not in folder and not Path(os.path.expanduser(folder)).exists():
        raise ValueError(f"{v!r} is neither a known model name ({', '.join(sorted({**KNOWN, **ALIASES}))}; "
                         f"`webrl models list`) nor an existing folder (give a path like ./{v} for a folder here)")
    return _existing_path(folder)


class RunConfig(Section):
    name: str = Field("default", description="run name; the run directory is <root>/<name>")
    root: str = Field("runs", description="folder that holds run directories")
    seed: int = Field(0, ge=0, description="global seed for task sampling, rollouts and training")
    phases: int = Field(2, ge=1, description="number of WebRL phases `webrl train` runs after the bootstrap (phase 0 "
                        "alone: `webrl bootstrap`)")


class SitesConfig(Section):
    mode: Literal["embedded", "webarena"] = Field(
        "embedded", description="embedded: our five mini sites serve every site not in urls; webarena: urls only")
    urls: dict[str, str] = Field(default_factory=dict,
                                 description="site name -> base URL; filled from SHOPPING, WA_SHOPPING, ... env vars")
    host: str = Field("127.0.0.1", description="interface the embedded sites bind to (loopback only)")
    port: int = Field(0, ge=0, le=65535, description="port of the embedded sites server; 0 picks a free one")
    data_seed: int = Field(0, ge=0, description="seed of the embedded sites' generated data")
    workers: Literal["process", "thread"] = Field(
        "process", description="serve the embedded sites from a child process (no GIL contention with the rollout) "
        "or a thread of the rollout process")
    auth_dir: str = Field(".auth", description="folder with <site>_state.json storage states for real WebArena "
                          "(`webrl webarena login` writes them)")
    reset_command: str | None = Field(
        None, description="shell command run before every task with require_reset (real WebArena: restore the "
        "sites it changes); {sites} is replaced by the task's sites, comma-separated, {task_id} by its id. Empty: "
        "such tasks run on the sites as they are, with a warning")

    @field_validator("urls")
    @classmethod
    def _known_sites(cls, v: dict[str, str]) -> dict[str, str]:
        bad = sorted(set(v) - set(ALL_SITES))
        if bad:
            raise ValueError(f"unknown site(s) {bad}; allowed: {list(ALL_SITES)}")
        for site, url in v.items():
            parts = urlsplit(str(url))
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ValueError(f"{site}: {url!r} is not an http(s) URL like http://localhost:8023 (set in the "
                                 f"config, or by the {site.upper()} / WA_{site.upper()} environment variable)")
        return v

    @field_validator("host")
    @classmethod
    def _loopback(cls, v: str) -> str:
        return _loopback_host(v)


class EnvConfig(Section):
    n_envs: int = Field(4, ge=1, description="browser contexts running episodes at the same time")
    contexts_per_browser: int = Field(8, ge=1, description="contexts sharing one Chromium process")
    chromium_path: str = Field(
        "auto", description="Chromium executable Playwright launches; auto: Debian's chromium-headless-shell when "
        "headless and installed (the old headless mode, which Playwright itself uses for headless runs: 1.45-2x the "
        "env steps/s of the full browser here, `webrl bench rollout`), else /usr/bin/chromium")
    headless: bool = Field(True, description="run Chromium headless")
    viewport_width: int = Field(1280, ge=100, description="browser viewport width in CSS pixels")
    viewport_height: int = Field(720, ge=100, description="browser viewport height in CSS pixels")
    max_steps: int = Field(30, ge=1, description="actions per episode before it is stopped")
    parse_failure_limit: int = Field(5, ge=1, description="consecutive unparseable actions that end an episode")
    repeat_action_limit: int = Field(5, ge=1, description="identical actions in a row that end an episode")
    obs_char_budget: int = Field(15872, ge=256, description="characters of history + HTML in a prompt (16384-512)")
    keep_bbox: bool = Field(False, description="keep data-bbox attributes in the observation")
    settle_timeout_ms: int = Field(3000, ge=0, description="upper bound on waiting for a page to settle after an action")
    action_timeout_ms: int = Field(5000, ge=100, description="timeout of one browser action")
    type_replaces: bool = Field(True, description="Type clears the field first (fixes the official Meta+A append bug)")
    screenshots: bool = Field(False, description="save a PNG screenshot per step for the viewer")
    episode_retries: int = Field(1, ge=0, description="retries of an episode whose browser crashed before marking it error")
    block_other_hosts: bool = Field(True, description="block navigation outside the task's sites and record it")
    viewport_only: bool = Field(True, description="observe only elements inside the viewport (VAB: current_viewport_only)")
    batch_wait_s: float = Field(0.25, ge=0, description="longest a waiting env holds the idle policy for busy envs "
                                "before calling it (time during a call does not count)")
    batch_wait_calls: float = Field(
        0.5, ge=0, description="a waiting env also holds up to this share of the last policy call's seconds: an env "
        "that misses a batch waits a whole call for the next, so a slow policy (a CPU model, seconds a batch) is "
        "worth waiting for stragglers on; 0: batch_wait_s alone (docs/benchmarks.md#rollouts-with-the-model-acting)")
    max_error_rate: float = Field(0.2, ge=0, le=1, description="a rollout or evaluation whose share of errored "
                                  "episodes (crash, hang, site failure) exceeds this fails, naming the first errors")


class PromptConfig(Section):
    style: Literal[STYLES] = Field(
        "completion", description="completion: WebRL raw prompt; chat: the rounds as chat turns through the actor "
        "tokenizer's own chat template (its special tokens, not Llama-3 header text), rendered once as the prompt "
        "string every stage sees; a served model without a local tokenizer gets the messages instead")
    observation: Literal[OBSERVATIONS] = Field(
        "html", description="html: the simplified HTML as extracted (the official observation); compact: one line "
        "per block, interactive elements as [id] text, table rows as one line (webrl_core/compact_page.py), about "
        "half the tokens; compact_id_after: the same with each id after the element's text (text [id]), the order "
        "in which the actor writes them (# Element: text, then element=\"id\"); X+screenshot: X and the step's "
        "screenshot as an image part, screenshot: the image instead of the page text (both need an OpenAI-compatible "
        "chat endpoint, policy.backend openai with prompt.style chat: a VLM such as Qwen2.5-VL served by vLLM)")
    compat: Literal[COMPATS] = Field(
        "webrl", description="webrl: our wording of the official format (models we train); official: the exact "
        "input strings the released WebRL actor and ORM checkpoints were trained on, so they can be dropped in; "
        "webrl_restated: webrl with the task instruction repeated after the current page, right before the action "
        "(a small from-scratch model copies names from a few tokens back)")


class LoraConfig(Section):
    enabled: bool = Field(False, description="train LoRA adapters instead of all weights")
    r: int = Field(16, ge=1, description="LoRA rank")
    alpha: int = Field(32, ge=1, description="LoRA scaling numerator")
    dropout: float = Field(0.05, ge=0, le=1, description="LoRA dropout")
    target_modules: str | list[str] = Field("all-linear", description="modules that get adapters")


class EmbeddedModelConfig(Section):
    vocab_size: int = Field(2048, ge=300, description="BPE vocabulary size of the embedded tokenizer")
    hidden_size: int = Field(256, ge=16, description="hidden size of the embedded Llama")
    intermediate_size: int = Field(704, ge=16, description="MLP size of the embedded Llama")
    num_layers: int = Field(4, ge=1, description="decoder layers of the embedded Llama")
    num_heads: int = Field(4, ge=1, description="attention heads of the embedded Llama")
    max_length: int = Field(2048, ge=64, description="max tokens (positions) of the embedded models")
    arch: Literal["llama", "qwen2", "gpt_neox"] = Field("llama", description="architecture of the embedded model")
    entity_tokens: bool = Field(
        False, description="embedded sites: every named thing of the sites' data (product, customer, place, post, "
        "issue, project and user names, order numbers) is one token of the embedded tokenizer, so typing a name "
        "from the intent is copying one token (a from-scratch model does not learn to copy multi-token names)")
    tie_embeddings: bool = Field(
        False, description="share the input embedding and the LM head: a copied token scores highest by its own "
        "embedding, also for tokens rarely seen in training")


class ModelsConfig(Section):
    actor: str | None = Field(None, description="HF folder of the starting actor (SFT model); empty: build the embedded one")
    orm: str | None = Field(None, description="HF folder of the ORM; empty: train the embedded one")
    critic: str | None = Field(None, description="folder of a trained critic to resume; empty: init from the actor")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="compute dtype: auto = bfloat16 on a CPU with amx_bf16/avx512_bf16 or a bf16 GPU, else "
        "float32 (float16 on an old GPU); training keeps float32 master weights of the trained parameters under "
        "autocast, the frozen ones in this dtype")
    dtype_reason: str = Field("", description="why models.dtype is what it is (filled in when auto is resolved)")
    device: str = Field("auto", description="'auto', 'cpu', 'cuda', 'cuda:0', ...")
    gradient_checkpointing: bool = Field(False, description="recompute activations to save memory")
    train_layers: int | None = Field(
        None, ge=1, description="train only the top N decoder layers and the final norm (embeddings, LM head and the "
        "layers below stay frozen: no weight gradients and no backward below them); empty: all weights (or LoRA)")
    max_length: int = Field(4096, ge=64, description="max tokens of prompt+action; the observation is cut, never the action")
    attn_implementation: Literal["auto", "sdpa", "eager", "matmul", "flash_attention_2", "flex_attention"] = Field(
        "auto", description="attention kernel (transformers' attn_implementation; matmul: learn/matmul_attention.py, "
        "two bf16 matmuls up to a crossover length measured on the box, sdpa beyond). auto: a model trained on a CPU "
        "loads with matmul and its stage measures it against sdpa with its micro-batch, keeping the faster "
        "(learn/micro_batch.py); every other pass uses transformers' default (sdpa); a name: every model loaded "
        "uses it")
    compile_layers: Literal["off", "on", "auto"] = Field(
        "off", description="run each decoder layer of a training stage through torch.compile (inductor, dynamic "
        "shapes) after its calibration: fewer kernels for the norms, rotary, activation and casts. It costs a "
        "compilation per stage process (13-40 s on a 2-core CPU) and makes each pass 1.07-1.23x faster "
        "(docs/benchmarks.md#compiled-decoder-layers-modelscompile_layers); auto: only a stage of at least "
        "models.COMPILE_PAYS_PASSES forward/backward passes, where that pays")
    weight_casts: Literal["per_step", "per_micro_batch"] = Field(
        "per_step", description="a training stage in mixed precision (float32 trained weights, bf16/fp16 autocast): "
        "per_step: a trained weight's low-precision copy is made at its first use after an optimizer step and "
        "reused by every micro-batch until the next (autocast's cast cache kept across the accumulation, "
        "learn/trainer_utils.py weight_casts_per_step; the demo's critic epoch 1.0-1.1x); per_micro_batch: "
        "autocast's default, one copy per forward. Compiled layers (models.compile_layers) cast inside their own "
        "code either way")
    lora: LoraConfig = Field(default_factory=LoraConfig, description="LoRA settings for every trained model")
    embedded: EmbeddedModelConfig = Field(default_factory=EmbeddedModelConfig, description="embedded default model sizes")

    @field_validator("actor", "orm", "critic")
    @classmethod
    def _exists(cls, v: str | None, info) -> str | None:
        """A known short name (``smollm2-135m-instruct``) becomes its model-cache folder; the folder must exist."""
        return _model_ref(v)

    @property
    def dtype_why(self) -> str:
        """Why ``dtype`` is what it is, for printing: the auto choice's reason, or that the config set it."""
        return self.dtype_reason or "set by models.dtype"

    @model_validator(mode="after")
    def _resolve_auto_dtype(self) -> ModelsConfig:
        """``dtype: auto`` becomes the concrete dtype the hardware is fast at (``webrl_core.hardware``)."""
        if self.dtype == "auto":
            dtype, why = auto_dtype(self.device)
            self.__dict__["dtype"], self.__dict__["dtype_reason"] = dtype, f"auto: {why}"
        return self


SERVING_COMMANDS: dict[str, str] = {
    "webrl": "{python} -m webrl_core.agent.serve_hf --model {model} --host {host} --port {port} "
             "--served-model-name {served_model_name} --dtype {dtype} --device {device}",
    "vllm": "{python} -m vllm.entrypoints.openai.api_server --model {model} --host {host} --port {port} "
            "--served-model-name {served_model_name} --dtype {dtype} --max-model-len {max_length} --seed {seed}",
    "sglang": "{python} -m sglang.launch_server --model-path {model} --host {host} --port {port} "
              "--served-model-name {served_model_name} --dtype {dtype} --context-length {max_length} "
              "--random-seed {seed}",
}
"""Default command template of each serving engine (``serving.command`` overrides it). Placeholders: python, model,
host, port, served_model_name, dtype, device, max_length, seed. vLLM: ``vllm serve``'s OpenAI server module;
SGLang: ``sglang.launch_server``; webrl: the project's own HF server (``webrl_core.agent.serve_hf``)."""


class ServingConfig(Section):
    """How ``policy.backend: openai`` gets its endpoint: a server the rollout and evaluation stages start for the
    actor they need and stop afterwards (``webrl_core.agent.serving``), or one managed by the user (``external``)."""

    engine: Literal["webrl", "vllm", "sglang", "external"] = Field(
        "webrl", description="webrl: the project's HF server (CPU default); vllm / sglang: that engine, started "
        "from serving.command with serving.python; external: policy.base_url as it is, which must report the "
        "expected checkpoint (its path as `root` or its digest as `webrl_digest`) or the stage fails")
    command: str | None = Field(
        None, description="command template that starts the engine (placeholders {python} {model} {host} {port} "
        "{served_model_name} {dtype} {device} {max_length} {seed}); empty: the engine's default (SERVING_COMMANDS)")
    python: str | None = Field(
        None, description="interpreter of the engine, e.g. .venv-vllm/bin/python (infra/setup_vllm.sh); empty: the "
        "flow's own")
    host: str = Field("127.0.0.1", description="interface the served actor binds to")
    port: int = Field(0, ge=0, le=65535, description="port of the served actor; 0 picks a free one")
    served_model_name: str = Field("webrl-actor", description="model name the engine serves the actor under")
    startup_timeout_s: float = Field(900.0, gt=0, description="seconds to wait for the engine's /v1/models")
    extra_args: list[str] = Field(default_factory=list, description="more arguments appended to the command, e.g. "
                                  "[--tensor-parallel-size, '2', --gpu-memory-utilization, '0.85']")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment variables of the engine "
                                "(e.g. CUDA_VISIBLE_DEVICES). vLLM on a CPU gets VLLM_CPU_KVCACHE_SPACE sized for "
                                "models.max_length x policy.concurrency unless set here (serving.cpu_kv_cache_env)")

    @field_validator("python")
    @classmethod
    def _python_exists(cls, v: str | None) -> str | None:
        return _existing_path(v)

    @field_validator("host")
    @classmethod
    def _loopback(cls, v: str) -> str:
        return _loopback_host(v)


class PolicyConfig(Section):
    backend: Literal["hf", "openai", "oracle", "random"] = Field(
        "hf", description="hf: in-process model; openai: OpenAI-compatible server; oracle/random: scripted")
    base_url: str | None = Field(None, description="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
    model_name: str | None = Field(None, description="model name sent to the endpoint")
    api_key_env: str = Field("OPENAI_API_KEY", description="env var holding the endpoint's API key")
    temperature: float = Field(1.0, ge=0, description="sampling temperature for training rollouts (paper: 1)")
    eval_temperature: float = Field(0.0, ge=0, description="sampling temperature for test-set evaluation (0 = greedy)")
    top_p: float = Field(0.9, gt=0, le=1, description="nucleus sampling mass")
    seeded: bool = Field(
        True, description="sample each action from its own random stream seeded from (episode id, step) "
        "(identity.action_seed; sent to a served model as the OpenAI API's `seed`), so the same run seed repeats "
        "the same episodes whichever requests share a batch, and an ablation's variants with one policy share "
        "their experience. false: one global stream per batch (not reproducible)")
    max_new_tokens: int = Field(128, ge=1, description="tokens generated per action")
    batch_size: int = Field(16, ge=1, description="prompts per generate() call in-process")
    decode_matmul: Literal["auto", "linear"] = Field(
        "auto", description="in-process model on a CPU. auto: each weight shape's product at each row count up to "
        "batch_size as x W^T, (W x^T)^T or on oneDNN's packed weight, whichever this box ran "
        "fastest, measured once per CPU (agent/decode_linear.py; on the AVX2 EPYC the LM head at 4 rows 21 -> 8 ms, "
        "on the AVX512-BF16 EPYC the decoder's products 12 -> 8 ms a step, docs/benchmarks.md); linear: torch's "
        "linear throughout")
    prefill: Literal["auto", "rows", "padded"] = Field(
        "auto", description="in-process model: how a generate() call reads its prompts before decoding. rows: each "
        "prompt alone, its keys and values laid into the batch's cache, no padding (agent/kv_cache.py "
        "prefilled_cache; the demo's rollout prompts of 134-535 tokens: 9.0 against 14.4 s for 51 prompts in "
        "calls of 8, AVX512-BF16 EPYC, docs/benchmarks.md); padded: the left-padded batch in one pass (what a GPU "
        "runs in parallel); auto: rows on a CPU, padded elsewhere")
    concurrency: int = Field(16, ge=1, description="concurrent requests to an OpenAI-compatible server")
    name_grounding: Literal["off", "phases", "all"] = Field(
        "off", description="ours (agent/grounding.py): when a response's '# Element: NAME' line names exactly one "
        "element of the page and its element id is another's, the named element's id runs and is stored. phases: "
        "in the phases' own training rollouts only, so the evaluated actor acts as written; all: in every model "
        "rollout (bootstrap and evaluation too); off: as written")


class OrmConfig(Section):
    threshold: float = Field(0.5, ge=0, le=1, description="success iff P(YES) >= threshold")
    max_html_chars: int = Field(12000, ge=100, description="characters of final HTML in the ORM prompt (HTML is cut, never the question)")
    epochs: float = Field(3.0, gt=0, description="ORM SFT epochs")
    lr: float = Field(5e-4, gt=0, description="ORM learning rate (embedded tiny model; 5e-6 for 8B as in the paper)")
    batch_size: int = Field(8, ge=1, description="ORM training step (its micro-batch measured on a CPU); the scoring "
                            "batch where none is measured (a CPU measures it: learn/micro_batch.py scoring_batch)")
    eval_fraction: float = Field(0.2, ge=0, lt=1, description="held-out share for ORM accuracy/precision/recall")
    positives: Literal["policy_first", "any"] = Field(
        "policy_first", description="which YES examples the class balance keeps: policy_first, the policies' own "
        "successes first and oracle demonstrations only to fill up (an ORM whose YES side is all demonstrations "
        "learns who acted: docs/results.md); any: a uniform draw over all successes")


class RewardConfig(Section):
    """Where a phase's episodes get their outcome label (the reward every step of the episode receives)."""

    source: Literal["orm", "env", "judge"] = Field(
        "orm", description="orm: the outcome reward model, success iff P(YES) >= orm.threshold (official code, "
        "what a real WebArena run without evaluators for generated tasks can use); env: the sites' own evaluators, "
        "the environment's reward function of the paper's Algorithm 1 (every embedded task has one); judge: PAE's "
        "autonomous evaluator, a zero-shot judge of the intent, the actions, the final page and answer (reward."
        "judge). The ORM scores the episodes either way, so its accuracy against the evaluators is reported")
    judge: str | None = Field(
        None, description="source=judge: an OpenAI-compatible endpoint (http://127.0.0.1:8000/v1; a GPU user serves "
        "a strong LLM or VLM there) or a local model, a short name or HF folder (smollm2-135m-instruct), asked "
        "zero-shot in-process")
    judge_model: str = Field("gpt-4o-2024-05-13", description="source=judge with an endpoint: the model name")
    judge_api_key_env: str = Field("OPENAI_API_KEY", description="env var holding the judge endpoint's API key")
    judge_screenshots: int = Field(
        0, ge=0, description="source=judge with an endpoint: the episode's last N screenshots sent as image parts "
        "(PAE's evaluator reads the last 3); needs env.screenshots")
    judge_max_html_chars: int = Field(3000, ge=100, description="characters of the final page in the judge's prompt")


class MicroBatched(Section):
    """A training section whose optimizer step of ``batch_size`` items runs in forward passes of
    ``micro_batch_size``."""

    SECTION: ClassVar[str]

    @model_validator(mode="after")
    def _micro_divides_batch(self):
        if self.micro_batch_size and self.batch_size % self.micro_batch_size:
            name = self.SECTION
            raise ValueError(f"{name}.micro_batch_size={self.micro_batch_size} must divide {name}.batch_size="
                             f"{self.batch_size} (accumulation makes up the rest of the step)")
        return self


class CriticConfig(MicroBatched):
    SECTION: ClassVar[str] = "critic"

    lr: float = Field(3e-4, gt=0, description="critic learning rate (1e-6 for 8B models in the paper)")
    epochs: float = Field(1.0, gt=0, description="critic epochs per phase (paper: 1)")
    batch_size: int = Field(8, ge=1, description="prompts per critic optimizer step (x grad_accum)")
    micro_batch_size: int | None = Field(
        None, ge=1, description="prompts per forward pass (must divide batch_size; accumulation makes up the rest, "
        "the step is the same). None: on a CPU the fastest divisor, measured on the box and kept per shape "
        "(learn/micro_batch.py), else batch_size")
    head_init_std: float | None = Field(0.2, gt=0, description="std of the first two head Linears (official 0.2; ~1/sqrt(h) is calmer; null: PyTorch default)")
    max_grad_norm: float = Field(1.0, gt=0, description="critic gradient clipping (paper: 1.0)")
    grad_accum: int = Field(1, ge=1, description="critic gradient accumulation steps")
    replay: bool = Field(
        True, description="official: the critic trains on the whole buffer, the phase's transitions and the replayed "
        "successes; false: on the phase's own transitions only, so a success-only replay cannot teach it that every "
        "task succeeds (its values are the next phase's task filter)")


class TransitionsConfig(Section):
    """How stored episodes become step samples (``webrl_core.learn.transitions``), for the phase's own episodes and for
    the replayed ones alike."""

    gamma: float = Field(0.9, ge=0, le=1, description="discount of the Monte-Carlo return mc_return of every step "
                         "sample (official: 0.9)")


class ReplayConfig(Section):
    enabled: bool = Field(True, description="mix perplexity-filtered successful steps of earlier phases (ablation: off)")
    low: float = Field(0.5, ge=0, le=1, description="keep steps with 1/PPL > low")
    high: float = Field(0.95, ge=0, le=1, description="... and 1/PPL <= high")
    cap_ratio: float = Field(2.0, ge=0, description="at most cap_ratio x the current phase's step count")
    batch_size: int | None = Field(None, ge=1, description="batch of the perplexity pass; empty: measured on a CPU "
                                   "(learn/micro_batch.py scoring_batch), 8 elsewhere")
    scoring: Literal["all", "until_cap"] = Field(
        "until_cap", description="all: 1/PPL of every buffered step, then window and cap (the official code); "
                                 "until_cap: score a seeded shuffle until the cap is filled (the same random "
                                 "subset's distribution, a fraction of the cost once the buffer is large)")

    @model_validator(mode="after")
    def _window(self) -> ReplayConfig:
        if self.low >= self.high:
            raise ValueError(f"replay.low={self.low} must be below replay.high={self.high}: the window (low, high] "
                             f"of 1/perplexity would keep no step")
        return self


class ActorTrainConfig(MicroBatched):
    """The KL-constrained actor update: the only definition of its settings. ``webrl_trainer.WebRLConfig`` (the
    Trainer's arguments) takes its loss fields, with their types, defaults and help, from ``LOSS_FIELDS`` below,
    and its optimisation arguments from the rest (``WebRLConfig.from_settings``)."""

    SECTION: ClassVar[str] = "actor"
    LOSS_FIELDS: ClassVar[tuple[str, ...]] = ("loss", "kl", "beta", "beta_low", "beta_high", "lam", "margin",
                                              "paper_logratio", "count_norm", "epsilon", "epsilon_high",
                                              "loss_type", "num_iterations", "scale_rewards", "bc_length_quantile")
    CRITIC_FREE: ClassVar[tuple[str, ...]] = ("grpo", "filtered_bc")
    """Losses that need no critic: a recipe with one of them has no critic stage and no value filter."""

    # -- the actor loss (webrl_trainer.webrl_actor_loss, advantage.py; grpo.py) ------------------
    loss: Literal["paper", "official", "grpo", "filtered_bc"] = Field(
        "official", description="paper: Eq. 6 squared loss; official: repo's Huber rule; grpo: WebAgent-R1's "
        "multi-turn GRPO (group-normalised episode rewards, clipped ratio, KL to the phase-start actor; no critic); "
        "filtered_bc: PAE's filtered behaviour cloning (NLL of the successful episodes' actions; no critic)")
    kl: bool = Field(True, description="KL-constrained loss; False = plain SFT on the same data (Fig. 5 ablation)")
    beta: float = Field(1.0, ge=0, description="KL coefficient: loss=paper's beta (official uses 1/5 adaptively); "
                        "loss=grpo: TRL GRPOConfig.beta, the weight of the k3 KL to the phase-start actor per action "
                        "token (0: no KL term)")
    beta_low: float = Field(
        1.0, gt=0, description="loss=official: beta of the other samples (the repo: 1); a positive sample is pushed "
        "until its per-token log-ratio reaches A/beta, so a larger beta_low moves the steps the reference was unsure "
        "of less")
    beta_high: float = Field(5.0, gt=0, description="official adaptive beta for confident references (A >= 0 and "
                             "ref_prob >= 0.8, or A < 0 and ref_prob < 0.9); the others get beta_low")
    lam: float = Field(0.5, ge=0, le=1, description="lambda mixing 1-step TD and MC advantage (paper Eq. 9)")
    margin: float = Field(0.05, ge=0, description="official advantage margin subtracted from V(s')-V(s)")
    paper_logratio: Literal["sum", "mean"] = Field(
        "sum", description="loss=paper: sequence log-ratio (sum, the paper's log pi(a|s)) or per-token mean")
    count_norm: Literal["sample", "batch"] = Field(
        "sample", description="loss=official: divide the log-ratio by the sample's action tokens (the repo at its batch 1) or the batch's")
    epsilon: float = Field(0.2, gt=0, lt=1, description="loss=grpo: the ratio's clip range [1-epsilon, 1+epsilon_high] "
                           "(TRL GRPOConfig.epsilon)")
    epsilon_high: float | None = Field(None, gt=0, description="loss=grpo: the upper clip (TRL; DAPO: 0.28); None: "
                                       "epsilon")
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo"] = Field(
        "grpo", description="loss=grpo: how token losses are averaged (TRL GRPOConfig.loss_type): grpo, per action "
        "then over the batch; bnpo and dapo, over the batch's action tokens; dr_grpo, over batch x "
        "policy.max_new_tokens")
    num_iterations: int = Field(1, ge=1, description="loss=grpo: passes over the phase's samples (TRL GRPOConfig."
                                "num_iterations, mu): the ratio is against the policy that acted, the phase-start actor")
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group", description="loss=grpo: divide the group-centred reward by the group's std (WebAgent-R1, TRL's "
        "default), the batch's, or not at all (Dr. GRPO)")
    bc_length_quantile: float = Field(
        0.2, gt=0, le=1, description="loss=filtered_bc: per task, keep the successful episodes no longer than this "
        "quantile of their lengths (PAE's filteredbc top_p=0.2); 1 keeps every success")
    reuse_replay_logprobs: bool = Field(
        True, description="the KL losses: a replayed step's reference log-prob is n x log(1/PPL) of the replay "
        "stage's pass (the same phase-start actor, run without autocast: equal up to bf16 rounding), so the "
        "reference pass covers only the phase's new steps; false: every step is recomputed")

    # -- optimisation (TrainingArguments) -------------------------------------------------------
    lr: float = Field(1e-4, gt=0, description="actor LR; paper 1e-6 for 8B; the tiny embedded model needs ~1e-4 to move")
    epochs: float = Field(1.0, gt=0, description="actor epochs per phase (paper: 1)")
    batch_size: int = Field(8, ge=1, description="samples per optimizer step (x grad_accum)")
    grad_accum: int = Field(1, ge=1, description="gradient accumulation steps")
    micro_batch_size: int | None = Field(
        None, ge=1, description="samples per forward pass (must divide batch_size; accumulation makes up the rest). "
        "None: on a CPU the fastest divisor, measured on the box and kept per shape (learn/micro_batch.py: 1 on an "
        "AVX2 box, where padding costs more than batching saves), else batch_size")
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping (paper: 1.0; also the bootstrap SFT's)")


class CurriculumConfig(Section):
    generator: Literal["embedded", "openai", "hf", "propose", "train_pool"] = Field(
        "embedded", description="embedded: vary failed tasks within site families; openai/hf: LLM in-breadth evolving "
        "from failures; propose: PAE's context-aware proposer, tasks written from each site's name, description and "
        "the entities its pages show, not from failures (an LLM when base_url or hf_model is set, else the embedded "
        "proposer over all of a site's task families); train_pool: no curriculum, tasks_per_phase tasks drawn each "
        "phase from the training task pool (WebAgent-R1 trains on WebArena-Lite's training tasks)")
    tasks_per_phase: int = Field(500, ge=1, description="tasks kept per phase after filtering (paper: 500)")
    rollouts_per_task: int = Field(
        1, ge=1, description="episodes the phase's actor samples on each kept task (official and paper: 1); more "
        "gives a task the actor solves rarely more chances to be solved once, so its success enters the update")
    breadth: float = Field(
        0.0, ge=0, le=1, description="generator=embedded: share of the generated tasks drawn from another task family "
        "of the failed task's site instead of its own (a different kind of task on the same website, the paper's "
        "in-breadth evolving; the LLM generators do this by their prompt). 0 = within the family only; ours")
    generation_turns: int = Field(2, ge=1, description="LLM calls per site per phase")
    seed_num: int = Field(10, ge=1, description="failed tasks shown per LLM call")
    base_url: str | None = Field(None, description="OpenAI-compatible endpoint of the generator")
    model_name: str = Field("gpt-4o-2024-05-13", description="generator model name")
    hf_model: str | None = Field(None, description="local HF model folder for generator=hf")
    seed_tasks: str | None = Field(
        None, description="WebArena-Lite-format task file (JSON list of task configs) the phase-0 actor rolls out: "
        "its failures seed phase 1's task generation (needed when bootstrap.sft_actor or bootstrap.sft_data is set, "
        "since no embedded bootstrap rollouts exist then)")
    api_key_env: str = Field("OPENAI_API_KEY", description="env var holding the generator endpoint's API key")
    filter_low: float = Field(0.05, ge=0, le=1, description="keep generated tasks whose critic value is >= this")
    filter_high: float = Field(0.75, ge=0, le=1, description="... and <= this")
    min_kept_fraction: float = Field(
        0.25, ge=0, le=1, description="if the value filter keeps fewer than this fraction of tasks_per_phase, top up "
        "with the dropped tasks nearest the window, taking turns between sites (official: 0, a phase may get no tasks)")
    min_kept_per_site: int = Field(
        0, ge=0, description="after the filter (and the phase's cap), every site among the candidates keeps at least "
        "this many tasks: its dropped ones nearest the window, marked filter_top_up (may exceed tasks_per_phase by "
        "sites x this). 0 = the paper's window alone; not in the paper or the official code")
    phase1_filter: Literal["skip", "orm"] = Field("skip", description="filter in phase 1 without a trained critic")
    human_review: bool = Field(False, description="pause the flow for approval of generated tasks in the Prefect UI")
    review_timeout_s: int = Field(3600, ge=1, description="seconds to wait for review before the default applies")
    review_default: Literal["approve", "drop"] = Field("approve", description="decision when the review times out")


    @field_validator("seed_tasks")
    @classmethod
    def _seed_file(cls, v: str | None) -> str | None:
        return _existing_path(v)

    @model_validator(mode="after")
    def _filter_window(self) -> CurriculumConfig:
        if self.filter_low > self.filter_high:
            raise ValueError(f"curriculum.filter_low={self.filter_low} is above curriculum.filter_high="
                             f"{self.filter_high}: the critic filter [low, high] would keep no task")
        return self

    @model_validator(mode="after")
    def _breadth_is_embedded(self) -> CurriculumConfig:
        if self.breadth > 0 and self.generator != "embedded":
            raise ValueError(f"curriculum.breadth={self.breadth} applies to generator=embedded (task families); "
                             f"generator={self.generator!r} writes varied tasks by its prompt: set breadth to 0")
        return self


class BootstrapConfig(Section):
    demo_tasks: int = Field(400, ge=1, description="training tasks the oracle demonstrates (embedded SFT data)")
    rollout_tasks: int = Field(120, ge=1, description="training tasks the SFT actor rolls out (ORM data, first failures)")
    random_tasks: int = Field(40, ge=0, description="training tasks a random policy rolls out (ORM negatives)")
    early_exit_tasks: int = Field(
        0, ge=0, description="training tasks the early-exit oracle rolls out (webrl_core.sites.oracle."
        "EarlyExitOraclePolicy: the oracle that writes exit(message=\"Done\") instead of its action with "
        "probability 0.35 per step), labelled by the sites' evaluators: ORM examples that look like demonstrations "
        "but stop short")
    sft_actor: str | None = Field(
        None, description="an existing SFT actor (HF folder or model name) as the phase-0 actor, no SFT trained. With "
        "curriculum.seed_tasks (real models) it is the whole bootstrap but the critic; on the embedded sites without "
        "seed tasks it takes only the SFT stage's place (say a `webrl bench sft-curve` checkpoint): demonstrations, "
        "SFT-actor rollouts, ORM and critic run as usual")
    sft_data: str | None = Field(
        None, description="demonstrations to fine-tune models.actor on in phase 0: a LLaMA-Factory ShareGPT JSON "
        "(`conversations`: human = the full WebRL prompt, gpt = the action; the official SFT format) or a folder of "
        "VAB `traces/*.jsonl`")
    sft_lr: float = Field(1e-3, gt=0, description="LR of the bootstrap SFT of the embedded actor")
    sft_epochs: float = Field(8.0, gt=0, description="epochs of the bootstrap SFT")
    sft_loss: Literal["completion", "all"] = Field(
        "completion", description="bootstrap SFT loss on the action tokens only (TRL default), or on the prompt too "
        "(a from-scratch model learns the page format and copying from it much faster)")
    sft_entity_swap: float = Field(
        0.0, ge=0.0, le=1.0, description="embedded sites: share of SFT pairs whose entity names (products, places, "
        "users, ...) are replaced by random names of the same kind, in the intent, page and action alike, drawn "
        "anew each epoch (webrl_core/learn/entity_swap.py): the typed name can then only be copied from the intent, not "
        "memorised")
    sft_list_shuffle: float = Field(
        0.0, ge=0.0, le=1.0, description="compact observations: share of SFT pairs whose list lines (one id each, "
        "one shape, ids consecutive, 3 or more) have their texts permuted among the list's ids, the action's id "
        "following its text, drawn anew each epoch (webrl_core/learn/list_shuffle.py): the clicked id can then only "
        "be found by its name, not remembered from the demonstration")
    n_shards: int = Field(2, ge=1, description="rollout shards mapped as separate Prefect tasks")

    @field_validator("sft_actor", "sft_data")
    @classmethod
    def _exists(cls, v: str | None, info) -> str | None:
        return _model_ref(v) if info.field_name == "sft_actor" else _existing_path(v)


class EvalConfig(Section):
    test_set: str = Field("embedded", description="'embedded' (held-out test set) or a WebArena-Lite raw JSON path")
    max_tasks: int | None = Field(None, ge=1, description="evaluate only the first N test tasks (smoke runs)")
    judge: str | None = Field(
        None, description="OpenAI-compatible endpoint of the LLM judge that scores fuzzy_match and the N/A reason "
        "check (VAB's llm_fuzzy_match / llm_ua_match); empty: tasks that need it are reported unscored; 'none': "
        "score them by the deterministic fallback, and the summary says so")
    judge_model: str = Field("gpt-4-1106-preview", description="model of the LLM judge (VAB: gpt-4-1106-preview)")
    judge_api_key_env: str = Field("OPENAI_API_KEY", description="env var holding the judge endpoint's API key")


class TrackingConfig(Section):
    mlflow_uri: str | None = Field(None, description="MLflow tracking URI; empty: sqlite in the run dir; MLFLOW_TRACKING_URI wins")
    experiment: str = Field("webrl", description="MLflow experiment name")
