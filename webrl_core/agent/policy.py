"""Model policies behind the async batch ``Policy`` protocol (agent_api.py).

- ``HFPolicy``: an in-process Hugging Face causal LM. Prompts are tokenised with ``models.encode_prompt`` (BOS +
  prompt ids; a prompt longer than ``models.max_length - max_new_tokens`` loses the end of its observation, never
  its closing assistant header), left-padded into micro-batches of ``policy.batch_size`` and decoded with
  ``generate`` (a KV cache written in place, ``kv_cache.reserved_cache``; temperature/top-p sampling, greedy at
  temperature 0). Generation stops at ``<|eot_id|>``
  or EOS; the response is the text before the stop token. The blocking ``generate`` runs in a worker thread, so the
  event loop keeps serving the browsers while the model works. With per-prompt seeds (``policy.seeded``: from
  ``identity.action_seed`` of the step's episode id and step) each row samples from its own ``torch.Generator``
  (``SeededRowSampler``), so its text does not depend on the other prompts of its batch.
- ``OpenAIPolicy``: an OpenAI-compatible server (vLLM, SGLang, TGI) through the ``openai`` SDK with at most
  ``concurrency`` requests in flight; ``/completions`` with the raw WebRL prompt (style "completion") or
  ``/chat/completions`` with ``prompts.build_chat_messages`` built from the step contexts (style "chat"). Both stop
  at ``<|eot_id|>``. A screenshot observation (``prompt.observation: compact+screenshot``, ``screenshot``, ...)
  sends each step's PNG (the context's ``screenshot``, taken by the rollout) as an ``image_url`` part of the last
  user turn: a vision-language model served by vLLM (Qwen2.5-VL, LLaVA) reads it; only the chat style can carry
  it. Timeouts, connection errors, 429 and 5xx answers are retried by the SDK (``retries`` tries). A sampled request
  carries the OpenAI API's ``seed`` (``identity.action_seed``), which vLLM honours per request.
- ``openai_app(policy)``: a tiny OpenAI-compatible Starlette app around an ``HFPolicy``, so the embedded model can be
  served exactly like a vLLM endpoint (used by the tests and for local runs without vLLM); a request's ``seed``
  reaches ``HFPolicy.generate`` as that prompt's seed; a message with an image part is refused (400): the model
  reads text only.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import torch
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from transformers import LogitsProcessor, LogitsProcessorList

from webrl_core.agent import decode_linear
from webrl_core.agent.kv_cache import prefilled_cache, reserved_cache
from webrl_core.agent_api import StepContext
from webrl_core.artifacts import sha256_path
from webrl_core.config import ModelsConfig, PolicyConfig
from webrl_core.identity import action_seed
from webrl_core.learn.models import (encode_prompt, left_pad, load_causal_lm, load_tokenizer, resolve_device,
                               stop_token_id)
from webrl_core.prompts import (DEFAULT_BUDGET, STOP_TOKEN, PromptFormat, as_format, build_chat_messages,
                                check_screenshot_input)

if TYPE_CHECKING:
    import openai

SEED_RANGE = (-(1 << 63), (1 << 63) - 1)
"""Seeds a request may carry: a signed 64-bit int, the range vLLM's OpenAI server validates ``seed`` against."""


def context_seeds(contexts: list[StepContext] | None, temperature: float, cfg: PolicyConfig) -> list[int | None]:
    """Each step's sampling seed (``identity.action_seed(episode_id, step)``); None where there is nothing to
    seed: greedy decoding, ``policy.seeded`` off, or a step without an episode id."""
    if not contexts or temperature <= 0 or not cfg.seeded:
        return [None] * len(contexts or [])
    return [action_seed(c.episode_id, c.step) if c is not None and c.episode_id else None for c in contexts]


NUCLEUS_CANDIDATES = 64
"""Tokens ``SeededRowSampler`` looks at first: when the most probable 64 already hold ``top_p`` of the mass (a
trained policy at the demo's T = 0.7, nearly always), the nucleus lies among them and the full-vocabulary sort is
skipped; otherwise the row falls back to sorting every token."""


def nucleus(probs: torch.Tensor, top_p: float, candidates: int = NUCLEUS_CANDIDATES
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """(token ids, their probabilities) of one row's top-p nucleus, most probable first, the rest of the mass
    dropped (not renormalised; ``torch.multinomial`` does not need it). The nucleus is the smallest prefix of the
    tokens by descending probability whose mass reaches ``top_p``: a token stays while the mass before it is below
    ``top_p`` (Holtzman et al. 2020). ``top_p >= 1`` keeps every token, unsorted.

    Sorting 49,152 probabilities costs about 8 ms per decoded token on a 2-core CPU (4 rows), an eighth of the
    step; ``torch.topk`` of ``candidates`` costs 0.2 ms, and when their mass reaches ``top_p`` the nucleus is the
    same set with the same probabilities (the token after them has at least ``top_p`` before it)."""
    if top_p >= 1.0:
        return torch.arange(probs.shape[-1], device=probs.device), probs
    top = None
    if candidates < probs.shape[-1]:
        top, ids = probs.topk(candidates)
    if top is None or float(top.sum()) < top_p:  # the nucleus may reach past the candidates
        top, ids = probs.sort(descending=True, stable=True)
    mass_before = top.cumsum(dim=-1) - top
    keep = int((mass_before < top_p).sum().clamp(min=1))  # the first token always stays
    return ids[:keep], top[:keep]


class SeededRowSampler(LogitsProcessor):
    """Temperature and top-p (nucleus) sampling in which row ``i`` of the batch draws from its own
    ``torch.Generator`` seeded with ``seeds[i]``, a ``transformers.LogitsProcessor`` (``__call__(input_ids, scores)
    -> scores``). It returns scores that are -inf everywhere but the drawn token, so ``generate(do_sample=False)``
    (argmax) takes that token. A row's draws use only its own logits and generator: its text is the same alone,
    in any batch and in any order. Top-p keeps the smallest set of most probable tokens whose mass reaches
    ``top_p`` (``nucleus``; Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration"); no top-k."""

    def __init__(self, seeds: list[int], temperature: float, top_p: float):
        if temperature <= 0:
            raise ValueError(f"SeededRowSampler samples; temperature={temperature} is greedy decoding")
        self.seeds = [int(s) for s in seeds]
        self.temperature, self.top_p = float(temperature), float(top_p)
        self.generators: list[torch.Generator] | None = None  # made on the device of the first scores

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        if scores.shape[0] != len(self.seeds):
            raise ValueError(f"{scores.shape[0]} rows of scores for {len(self.seeds)} seeds")
        if self.generators is None:
            self.generators = [torch.Generator(device=scores.device).manual_seed(s) for s in self.seeds]
        probs = torch.softmax(scores.float() / self.temperature, dim=-1)
        chosen = []
        for row, gen in enumerate(self.generators):
            ids, kept = nucleus(probs[row], self.top_p)
            chosen.append(ids[torch.multinomial(kept, 1, generator=gen)])
        return torch.full_like(scores, float("-inf")).scatter_(1, torch.stack(chosen), 0.0)


class HFPolicy:
    """Batched in-process generation with a Hugging Face causal LM."""

    def __init__(self, model_path: str | os.PathLike, cfg: PolicyConfig | None = None,
                 models_cfg: ModelsConfig | None = None, temperature: float | None = None,
                 policy_id: str | None = None, style: str = "completion", compat: str | PromptFormat = "webrl",
                 obs_budget: int = DEFAULT_BUDGET):
        check_screenshot_input(as_format(compat).observation, "hf", style)  # before the model loads: no image input
        models_cfg = models_cfg or ModelsConfig()
        self._bind(load_tokenizer(model_path), load_causal_lm(model_path, models_cfg, trainable=False),
                   cfg or PolicyConfig(), models_cfg, compat, obs_budget)
        if self.cfg.decode_matmul == "auto":
            decode_linear.apply(self.model, self.cfg.batch_size)
        self.model_path = str(model_path)
        self.device = resolve_device(self.models_cfg.device)
        self.temperature = self.cfg.temperature if temperature is None else temperature
        self.style = style
        self.policy_id = policy_id or f"hf:{Path(model_path).name}@T{self.temperature:g}"

    @classmethod
    def of_model(cls, model, tok, cfg: PolicyConfig, models_cfg: ModelsConfig, compat="webrl") -> HFPolicy:
        """Greedy generation with a model already in memory (a model being trained), as ``generate`` does for a
        checkpoint folder."""
        self = cls.__new__(cls)
        self._bind(tok, model, cfg, models_cfg, compat)
        self.framed = True  # prompts are given as the model reads them
        self.model_path, self.device, self.temperature, self.style = "<in memory>", model.device, 0.0, "completion"
        self.policy_id = "hf:<in memory>"
        return self

    def _bind(self, tok, model, cfg: PolicyConfig, models_cfg: ModelsConfig, compat: str | PromptFormat,
              obs_budget: int = DEFAULT_BUDGET) -> None:
        """The tokenizer, model and settings every generation reads: stop ids and the prompt's token room."""
        fmt = as_format(compat)
        self.cfg, self.models_cfg, self.tok, self.model = cfg, models_cfg, tok, model
        self.framed = fmt.framed  # prompts arrive rendered through the chat template already
        self.obs_budget = obs_budget  # env.obs_char_budget: the chat turns cut the page as the stored prompt does
        self.format, self.compat = fmt, fmt.compat
        self.stop_ids = sorted({stop_token_id(tok)} | ({tok.eos_token_id} - {None}))
        max_pos = getattr(model.config, "max_position_embeddings", None) or models_cfg.max_length
        self.max_prompt_tokens = min(models_cfg.max_length, max_pos) - cfg.max_new_tokens
        if self.max_prompt_tokens < 16:
            raise ValueError(f"policy.max_new_tokens={cfg.max_new_tokens} leaves no room for the prompt "
                             f"(model max length {min(models_cfg.max_length, max_pos)})")
        self._lock = threading.Lock()  # one generate() at a time; concurrent act() calls queue here

    @property
    def policy_digest(self) -> str:
        """Identity in episode keys: the checkpoint's content digest (from its manifest; see ``artifacts``)."""
        return f"hf:{sha256_path(self.model_path)}"

    def _prompt_text(self, prompt: str, ctx: StepContext | None) -> str:
        if self.style != "chat" or self.framed:
            return prompt
        if ctx is not None:
            msgs = build_chat_messages(ctx.task.get("intent", ""), ctx.past_responses, ctx.html,
                                       self.obs_budget, compat=self.format)
        else:
            msgs = [{"role": "user", "content": prompt}]
        if not getattr(self.tok, "chat_template", None):
            raise ValueError(f"prompt.style='chat' but the tokenizer of {self.model_path} has no chat template")
        return self.tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)

    @torch.no_grad()
    def generate(self, prompts: list[str], contexts: list[StepContext] | None = None,
                 temperature: float | None = None, max_new_tokens: int | None = None,
                 seeds: list[int | None] | None = None, top_p: float | None = None) -> list[str]:
        """Blocking batched generation: one response (text before the stop token) per prompt, in order.
        ``temperature``, ``max_new_tokens`` and ``top_p`` default to the policy's settings.

        ``seeds``: one per prompt (None: unseeded). When sampling, every row draws from its own generator
        (``SeededRowSampler``); an unseeded row's seed is drawn from torch's global RNG, so ``torch.manual_seed``
        still fixes it. Temperature 0 is greedy decoding."""
        temp = self.temperature if temperature is None else temperature
        new_tokens = max_new_tokens or self.cfg.max_new_tokens
        top_p = self.cfg.top_p if top_p is None else top_p
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts")
        texts = [self._prompt_text(p, contexts[i] if contexts else None) for i, p in enumerate(prompts)]
        ids = [encode_prompt(self.tok, t, self.max_prompt_tokens) for t in texts]
        if temp > 0:
            seeds = [int(torch.randint(0, SEED_RANGE[1], ())) if seeds is None or seeds[i] is None else seeds[i]
                     for i in range(len(ids))]
        # length-sorted micro-batches: less padding, identical results (a row samples from its own generator)
        by_length = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        chunks = [by_length[k:k + self.cfg.batch_size] for k in range(0, len(ids), self.cfg.batch_size)]
        out: list[str] = [""] * len(ids)
        with self._lock:
            for chunk in chunks:
                input_ids, mask = left_pad([ids[i] for i in chunk], self.tok.pad_token_id)
                kwargs = dict(do_sample=False, max_new_tokens=new_tokens, eos_token_id=self.stop_ids,
                              pad_token_id=self.tok.pad_token_id, use_cache=True, temperature=None, top_p=None,
                              top_k=None)
                if temp > 0:  # greedy decoding takes the one token each row's sampler left
                    kwargs["logits_processor"] = LogitsProcessorList(
                        [SeededRowSampler([seeds[i] for i in chunk], temp, top_p)])
                # keys and values written in place, not re-concatenated per token; on a CPU each prompt read
                # alone, without the batch's padding (kv_cache.py)
                cache = (prefilled_cache(self.model, [ids[i] for i in chunk], new_tokens)
                         if len(chunk) > 1 and self._prefill_rows() else None)
                if cache is None:
                    cache = reserved_cache(self.model, new_tokens)
                gen = self.model.generate(input_ids=input_ids.to(self.device), attention_mask=mask.to(self.device),
                                          past_key_values=cache, **kwargs)
                for row, i in enumerate(chunk):
                    new = gen[row, input_ids.shape[1]:].tolist()
                    cut = next((k for k, t in enumerate(new) if t in self.stop_ids), len(new))
                    out[i] = self.tok.decode(new[:cut], skip_special_tokens=True)
        return out

    def _prefill_rows(self) -> bool:
        """``policy.prefill``: each prompt alone (rows) or the padded batch; auto: rows on a CPU."""
        mode = self.cfg.prefill
        return mode == "rows" or (mode == "auto" and torch.device(self.device).type == "cpu")

    async def act(self, prompts: list[str], contexts: list[StepContext] | None = None) -> list[str]:
        if not prompts:
            return []
        seeds = context_seeds(contexts, self.temperature, self.cfg) if contexts else None
        return await asyncio.to_thread(self.generate, prompts, contexts, None, None, seeds)


class OpenAIPolicy:
    """Concurrent requests to an OpenAI-compatible completions (or chat) endpoint."""

    def __init__(self, base_url: str, model_name: str, cfg: PolicyConfig | None = None,
                 temperature: float | None = None, style: str = "completion", api_key: str | None = None,
                 policy_id: str | None = None, timeout_s: float = 120.0, retries: int = 3,
                 compat: str | PromptFormat = "webrl", obs_budget: int = DEFAULT_BUDGET):
        self.format = as_format(compat)
        self.compat = self.format.compat
        if not base_url or "://" not in base_url:
            raise ValueError(f"policy.base_url={base_url!r} is not a URL like http://127.0.0.1:8000/v1")
        if not model_name:
            raise ValueError("policy.model_name is empty; the endpoint needs a model name")
        if style not in ("completion", "chat"):
            raise ValueError(f"prompt.style={style!r}; allowed: 'completion', 'chat'")
        check_screenshot_input(self.format.observation, "openai", style)
        self.cfg = cfg or PolicyConfig()
        self.base_url = base_url.rstrip("/")
        self.model_name = model_name
        self.temperature = self.cfg.temperature if temperature is None else temperature
        self.style = style
        self.api_key = api_key if api_key is not None else os.environ.get(self.cfg.api_key_env, "EMPTY")
        self.policy_id = policy_id or f"openai:{model_name}@T{self.temperature:g}"
        self.timeout_s = timeout_s
        self.retries = retries
        self.obs_budget = obs_budget  # env.obs_char_budget: the chat turns cut the page as the stored prompt does

    def _request(self, prompt: str, ctx: StepContext | None) -> tuple[str, dict]:
        """The request's path and body. A sampled step with an episode id sends the OpenAI API's ``seed``
        parameter (``identity.action_seed``; vLLM's OpenAI server samples such a request from its own generator)."""
        body = {"model": self.model_name, "max_tokens": self.cfg.max_new_tokens, "temperature": self.temperature,
                "stop": [STOP_TOKEN]}
        if self.temperature > 0:
            body["top_p"] = self.cfg.top_p
        (seed,) = context_seeds([ctx], self.temperature, self.cfg)
        if seed is not None:
            body["seed"] = seed
        if self.style == "chat":
            shot = getattr(ctx, "screenshot", None) if self.format.screenshot else None
            if self.format.screenshot and shot is None:  # sending the text alone would act on half an observation
                raise ValueError(f"prompt.observation={self.format.observation!r}: step "
                                 f"{getattr(ctx, 'step', '?')} of {getattr(ctx, 'episode_id', '') or 'a request'} "
                                 f"came without its screenshot (the rollout takes one per step)")
            msgs = (build_chat_messages(ctx.task.get("intent", ""), ctx.past_responses, ctx.html, self.obs_budget,
                                        compat=self.format,
                                        screenshot=shot) if ctx
                    else [{"role": "user", "content": prompt}])
            return "/chat/completions", {**body, "messages": msgs}
        return "/completions", {**body, "prompt": prompt}

    def _client(self) -> openai.AsyncOpenAI:
        """An SDK client for one ``act`` call (its connections belong to the calling event loop). ``retries`` counts
        tries, the SDK's ``max_retries`` the ones after the first."""
        import openai  # here: a second of import that only the served-policy path needs

        return openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key or "EMPTY", timeout=self.timeout_s,
                                  max_retries=max(self.retries - 1, 0))

    async def _one(self, client: openai.AsyncOpenAI, sem: asyncio.Semaphore, prompt: str,
                   ctx: StepContext | None) -> str:
        import openai

        path, body = self._request(prompt, ctx)
        create = (client.chat.completions if self.style == "chat" else client.completions).with_raw_response.create
        async with sem:
            try:
                raw = await create(**body)
            except openai.APIError as e:
                raise RuntimeError(f"OpenAI-compatible request to {self.base_url}{path} (model {self.model_name!r}) "
                                   f"failed: {e}") from None
        try:  # not retried: it will not improve
            choice = raw.parse().choices[0]
            return choice.message.content if self.style == "chat" else choice.text
        except (ValueError, AttributeError, IndexError, TypeError) as e:
            raise RuntimeError(f"{self.base_url}{path} (model {self.model_name!r}) answered {raw.text[:200]!r}, "
                               f"not a completion ({type(e).__name__}: {e})") from None

    async def act(self, prompts: list[str], contexts: list[StepContext] | None = None) -> list[str]:
        if not prompts:
            return []
        sem = asyncio.Semaphore(self.cfg.concurrency)
        async with self._client() as client:
            return list(await asyncio.gather(*[self._one(client, sem, p, contexts[i] if contexts else None)
                                               for i, p in enumerate(prompts)]))


def served_model_card(base_url: str | None, model_name: str | None, api_key_env: str = "OPENAI_API_KEY",
                      timeout_s: float = 10.0) -> dict:
    """The model card an OpenAI-compatible endpoint lists for ``model_name`` (``GET /models``), every field kept:
    our own server reports the checkpoint's sha256 (``webrl_digest``), vLLM and SGLang the weights' folder
    (``root``)."""
    import openai

    if not base_url or "://" not in base_url:
        raise ValueError(f"policy.base_url={base_url!r} is not a URL like http://127.0.0.1:8000/v1")
    if not model_name:
        raise ValueError("policy.model_name is empty; the endpoint needs a model name")
    url = base_url.rstrip("/") + "/models"
    try:
        with openai.OpenAI(base_url=base_url.rstrip("/"), api_key=os.environ.get(api_key_env) or "EMPTY",
                           timeout=timeout_s, max_retries=0) as client:
            page = client.models.list()
        # the SDK keeps the fields it does not know (webrl_digest, root): to_dict() has them all
        cards = [c.to_dict() if isinstance(c, openai.BaseModel) else c for c in getattr(page, "data", None) or []]
    except (openai.APIError, ValueError, AttributeError, TypeError) as e:
        raise RuntimeError(f"policy endpoint policy.base_url={base_url!r} did not answer GET {url}: "
                           f"{type(e).__name__}: {e}") from None
    card = next((c for c in cards if isinstance(c, dict) and c.get("id") == model_name), None)
    if card is None:
        served = [c.get("id") for c in cards if isinstance(c, dict)]
        raise RuntimeError(f"policy endpoint {base_url} does not serve policy.model_name={model_name!r}; it serves "
                           f"{served}")
    return card


def served_model_digest(base_url: str | None, model_name: str | None, api_key_env: str = "OPENAI_API_KEY",
                        timeout_s: float = 10.0) -> str:
    """What an endpoint vouches for about ``model_name``: the checkpoint digest or folder of its card
    (``served_model_card``); ``unverified`` when it reports neither."""
    card = served_model_card(base_url, model_name, api_key_env, timeout_s)
    return str(card.get("webrl_digest") or card.get("root") or "unverified")


class PendingRequest(NamedTuple):
    """A request waiting in ``openai_app``'s queue: its prompt, sampling settings and the future of its answer."""

    prompt: str
    temperature: float
    max_tokens: int
    top_p: float
    seed: int | None
    answer: asyncio.Future


def openai_app(policy: HFPolicy, model_name: str = "webrl-embedded", max_batch: int | None = None,
               batch_wait_s: float = 0.01):
    """OpenAI-compatible ``/v1/completions``, ``/v1/chat/completions`` and ``/v1/models`` around an HFPolicy.
    Requests that arrive together (within ``batch_wait_s``) are generated in one batch, like a serving engine. An
    integer ``seed`` in a request (the OpenAI API's parameter) seeds that prompt's sampling (``HFPolicy.generate``),
    so its text does not depend on which requests arrived with it."""
    max_batch = max_batch or policy.cfg.batch_size
    queue: list[PendingRequest] = []
    wake = asyncio.Event()
    state: dict = {}

    def batch_key(q: PendingRequest) -> tuple[float, int, float, bool]:
        """One batch per (temperature, max_tokens, top_p, unseeded) so each request gets what it asked for."""
        return q.temperature, q.max_tokens, q.top_p, q.seed is None

    async def batcher() -> None:
        while True:
            await wake.wait()
            await asyncio.sleep(batch_wait_s)
            wake.clear()
            while queue:
                key = batch_key(queue[0])
                batch = [q for q in queue if batch_key(q) == key][:max_batch]
                for q in batch:
                    queue.remove(q)
                first = batch[0]
                seeds = None if first.seed is None else [q.seed for q in batch]
                try:
                    outs = await asyncio.to_thread(policy.generate, [q.prompt for q in batch], None,
                                                   first.temperature, first.max_tokens, seeds, first.top_p)
                    for q, o in zip(batch, outs):
                        q.answer.set_result(o)
                except Exception as e:  # surface the failure to every waiting request
                    for q in batch:
                        q.answer.set_exception(e)

    async def submit(prompt: str, body: dict) -> str:
        if "batcher" not in state:
            state["batcher"] = asyncio.get_running_loop().create_task(batcher())
        fut = asyncio.get_running_loop().create_future()
        queue.append(PendingRequest(prompt, float(body.get("temperature", policy.temperature)),
                                    int(body.get("max_tokens") or policy.cfg.max_new_tokens),
                                    float(body.get("top_p") or policy.cfg.top_p), body.get("seed"), fut))
        wake.set()
        return await fut

    def bad_sampling(body: dict) -> JSONResponse | None:
        """A 400 naming ``seed`` or ``top_p`` when the request's value is not one the sampler takes."""
        seed, top_p = body.get("seed"), body.get("top_p")
        if not (seed is None or (isinstance(seed, int) and not isinstance(seed, bool)
                                 and SEED_RANGE[0] <= seed <= SEED_RANGE[1])):
            message = f"'seed' must be a signed 64-bit integer, not {str(seed)[:40]!r}"
        elif not (top_p is None or (isinstance(top_p, (int, float)) and not isinstance(top_p, bool)
                                    and 0 < top_p <= 1)):
            message = f"'top_p' must be a number in (0, 1], not {str(top_p)[:40]!r}"
        else:
            return None
        return JSONResponse({"error": {"message": message}}, status_code=400)

    def envelope(kind: str, choice: dict, prompt: str, text: str) -> dict:
        n_prompt = len(policy.tok(prompt, add_special_tokens=False).input_ids)
        n_text = len(policy.tok(text, add_special_tokens=False).input_ids)
        return {"id": f"{kind}-{uuid.uuid4().hex[:12]}", "object": kind, "created": int(time.time()),
                "model": model_name, "choices": [choice],
                "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_text, "total_tokens": n_prompt + n_text}}

    async def completions(request: Request) -> JSONResponse:
        body = await request.json()
        if not isinstance(body.get("prompt"), str):
            return JSONResponse({"error": {"message": "'prompt' must be a string"}}, status_code=400)
        if (error := bad_sampling(body)) is not None:
            return error
        text = await submit(body["prompt"], body)
        return JSONResponse(envelope("text_completion", {"index": 0, "text": text, "finish_reason": "stop"},
                                     body["prompt"], text))

    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            return JSONResponse({"error": {"message": "'messages' must be a non-empty list"}}, status_code=400)
        if (error := bad_sampling(body)) is not None:
            return error
        if any(not isinstance(m.get("content"), str) for m in msgs if isinstance(m, dict)):
            # content parts (an image_url beside the text): a text-only causal LM cannot read them
            return JSONResponse({"error": {"message": f"model {model_name!r} reads text only: every message's "
                                           f"'content' must be a string (a screenshot observation needs a "
                                           f"vision-language model, e.g. served by vLLM)"}}, status_code=400)
        tok = policy.tok
        if getattr(tok, "chat_template", None):
            prompt = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        else:  # no template: the last user turn is the raw WebRL prompt
            prompt = msgs[-1]["content"]
        text = await submit(prompt, body)
        return JSONResponse(envelope("chat.completion", {"index": 0, "finish_reason": "stop",
                                                         "message": {"role": "assistant", "content": text}},
                                     prompt, text))

    async def models(request: Request) -> JSONResponse:
        # the checkpoint's digest lets a client put the served weights into its episodes' identity
        if "digest" not in state:
            state["digest"] = await asyncio.to_thread(sha256_path, policy.model_path)
        return JSONResponse({"object": "list", "data": [{"id": model_name, "object": "model", "root": str(policy.model_path),
                                                         "webrl_digest": state["digest"]}]})

    return Starlette(routes=[Route("/v1/completions", completions, methods=["POST"]),
                             Route("/v1/chat/completions", chat, methods=["POST"]),
                             Route("/v1/models", models, methods=["GET"])])
