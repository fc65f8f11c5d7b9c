"""A zero-shot outcome judge as a phase's reward (``reward.source: judge``): PAE's autonomous evaluator
(Proposer-Agent-Evaluator, arXiv 2412.13194) adapted to our sites.

Source of the protocol: PAE (github.com/amazon-science/PAE) ``utils_eval.evaluate`` with the system prompt
``scripts/prompts/evaluator_prompt.txt``: a strong model is asked, zero-shot, whether an episode accomplished its
task from the task, the agent's answer and the last 3 screenshots; the system prompt tells it to check the agent's
claims against the screenshots and to finish with SUCCESS or NOT SUCCESS; the reward is 1 iff the reply contains
"SUCCESS" and not "NOT SUCCESS" (``parse_verdict``). The prompt text here is ours (``JUDGE_SYSTEM``).

What the judge reads of an episode (``judge_case``): the intent, the agent's actions (its raw responses, one line
each, as the ORM reads them: ``prompts.fold_response``), the last page it saw as text (the stored observation of the
last step, the page on which the last action was issued, as the ORM reads it; the compact page with
``prompt.observation: compact``; cut to ``reward.judge_max_html_chars``), its final answer, and with
``reward.judge_screenshots: N`` the episode's last N screenshots (``<run_dir>/screenshots/<episode_id>/<idx>.png``
in step order, then ``final.png``, the page after the last action, when the rollout wrote one).

Where we depart from PAE, and why: PAE scores an episode without an ANSWER as 0 because its tasks are questions
about the live web. Many of our tasks ask to change a site (add to the cart, post, edit, set a filter) and end with
an action, so a missing answer cannot mean failure: every finished episode is judged, the prompt says that a
question is answered only by a correct answer while a change counts when the evidence shows it, and it shows
"none" as the answer of an episode the environment stopped (max_steps, early stop: its "Early stop: ..." text is no
answer of the agent). The text page is the page before the last action (the store keeps no observation after it):
an action task whose last action was not an ``exit`` is judged from the page it was issued on, unless the
screenshots (``final.png``) show the page after it.

Two judges, one interface (``judge(cases) -> list[Verdict]``):

* ``EndpointJudge``: an OpenAI-compatible ``/chat/completions`` endpoint (``reward.judge`` an http(s) URL,
  ``reward.judge_model``, the key in ``$<reward.judge_api_key_env>``) through the ``openai`` SDK, temperature 0; the
  screenshots go as ``image_url`` parts (``data:image/png;base64,...``) after the text. Its P(success) is 1 or 0.
  A reply with neither verdict (cut by max_tokens, a refusal) leaves the episode unscored (``p_success`` None, the
  reply kept as the note) instead of PAE's 0: such a reply says nothing about the episode, and a wrong failure
  label would teach the actor that a possibly good trajectory failed. An unreachable endpoint, or one that gives
  no verdict on any episode, is an ``OutcomeJudgeError`` naming ``reward.judge``.
* ``LocalJudge``: a local causal LM (a short name such as ``smollm2-135m-instruct`` or an HF folder) asked in
  process, the same evidence (text only) rendered through the model's chat template and closed by a YES/NO
  question; P(success) = P(YES) from the answers' next-token probabilities exactly as the ORM reads them
  (``orm.OrmScorer``: batched, no grad, multi-token answers scored on the prompt's KV cache); success iff
  P(success) >= 0.5. YES/NO rather than SUCCESS/NOT SUCCESS: two answers of similar length, the words a small
  instruct model answers a yes/no question with.

``outcome_judge_from_settings`` builds the one ``reward.judge`` names.
"""

from __future__ import annotations

import asyncio
import base64
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence
from urllib.parse import urlparse

from webrl_core.config import ModelsConfig, OrmConfig
from webrl_core.env.judge import JudgeError
from webrl_core.errors import WebrlError
from webrl_core.pretrained import resolve_model_ref
from webrl_core.prompts import PromptFormat, fold_response

SUCCESS, NOT_SUCCESS = "SUCCESS", "NOT SUCCESS"
LOCAL_THRESHOLD = 0.5  # P(success) at which the local judge says success (the ORM's official threshold)
LOCAL_BATCH_SIZE = 8   # prompts per forward of the local judge (the ORM's default micro-batch)
ENDPOINT_SAMPLING = {"temperature": 0, "max_tokens": 1024}  # room for a short reasoning before the verdict
ENDPOINT_CONCURRENCY = 8  # requests in flight at once: a served judge batches them

JUDGE_SYSTEM = (
    "You check whether a web agent accomplished a user's task on a website. You are given the task, the actions "
    "the agent took, the last page it saw{shots}, and its final answer if it gave one.\n"
    "Trust only this evidence: a claim in the answer that the page{or_shots} do not support does not count, and an "
    "agent that only says it succeeded has not. A task that asks for information is accomplished only when the "
    "answer gives it correctly. A task that asks to change something on the site (add, buy, post, edit, set, ...) "
    "is accomplished when the evidence shows the change was made, with or without an answer.\n"
    "{closing}")
ENDPOINT_CLOSING = ("Reason briefly, then end your reply with the verdict on its own line: SUCCESS if the task was "
                    "accomplished, NOT SUCCESS otherwise.")
LOCAL_CLOSING = "Reply with one word: YES if the task was accomplished, NO otherwise."
PAGE_CUT_NOTE = "\n[... page cut]"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class OutcomeJudgeError(JudgeError):
    """The outcome judge (``reward.judge``) could not be asked or gave no usable verdict."""


@dataclass(frozen=True)
class JudgeCase:
    """What the judge reads of one episode (``judge_case``)."""

    episode_id: str
    intent: str
    actions: tuple[str, ...]        # one line per step: the raw response, newlines folded
    page: str                       # the last page as text, already cut
    answer: str | None              # the agent's final answer; None when it gave none
    screenshots: tuple[Path, ...] = ()  # PNG files, oldest first


@dataclass(frozen=True)
class Verdict:
    """The judge's word on one episode: P(success) (1/0 from an endpoint), None when its reply had no verdict."""

    p_success: float | None
    note: str = ""  # the endpoint's reply (cut) or the local judge's P(YES)

    @property
    def success(self) -> bool | None:
        return None if self.p_success is None else self.p_success >= LOCAL_THRESHOLD


def episode_screenshots(folder: str | os.PathLike, n: int) -> list[Path]:
    """The last ``n`` screenshots of an episode's folder, oldest first: ``<idx>.png`` by step, then ``final.png``
    (the page after the last action) when the rollout wrote it."""
    if n <= 0:
        return []
    root = Path(folder)
    steps = sorted((p for p in root.glob("*.png") if p.stem.isdigit()), key=lambda p: int(p.stem))
    final = root / "final.png"
    return (steps + ([final] if final.is_file() else []))[-n:]


def episode_answer(episode: Mapping) -> str | None:
    """The agent's own final answer: its exit message when it ended the episode (status ``done``), else None (the
    environment's "Early stop: ..." text is not the agent's)."""
    answer = episode.get("final_answer")
    if episode.get("status") != "done" or not isinstance(answer, str) or not answer.strip():
        return None
    return answer.strip()


def judge_case(episode: Mapping, steps: Sequence[Mapping], *, max_page_chars: int, observation: str = "html",
               screenshot_dir: str | os.PathLike | None = None, n_screenshots: int = 0) -> JudgeCase:
    """The judge's input for a stored episode (steps in any order; the page is the last step's observation, as the
    ORM reads it; ``observation`` as ``prompt.observation``). ``n_screenshots > 0`` takes the last ones from
    ``screenshot_dir`` and fails when there are none (the episode was rolled out without ``env.screenshots``)."""
    if not steps:
        raise ValueError(f"episode {episode.get('episode_id')!r} has no steps; the judge needs at least one")
    ordered = sorted(steps, key=lambda s: s["idx"])
    page = PromptFormat(observation=observation).page(ordered[-1].get("html") or "")
    if len(page) > max_page_chars:
        page = page[:max_page_chars] + PAGE_CUT_NOTE
    shots: list[Path] = []
    if n_screenshots > 0:
        shots = episode_screenshots(screenshot_dir, n_screenshots) if screenshot_dir is not None else []
        if not shots:
            raise FileNotFoundError(
                f"reward.judge_screenshots={n_screenshots}: episode {episode.get('episode_id')!r} has no screenshots "
                f"in {screenshot_dir} (it was rolled out without env.screenshots); set env.screenshots: true before "
                f"the rollout, or reward.judge_screenshots: 0")
    return JudgeCase(episode_id=str(episode.get("episode_id")), intent=str(episode.get("intent") or ""),
                     actions=tuple(fold_response(s.get("response") or "") for s in ordered), page=page,
                     answer=episode_answer(episode), screenshots=tuple(shots))


def judge_system(closing: str, with_screenshots: bool) -> str:
    return JUDGE_SYSTEM.format(shots=" and screenshots of its last pages" if with_screenshots else "",
                               or_shots=" and the screenshots" if with_screenshots else "", closing=closing)


def judge_user_text(case: JudgeCase) -> str:
    """The evidence, one block each (the screenshots, if any, follow as images)."""
    actions = "\n".join(f"{i + 1}. {a}" for i, a in enumerate(case.actions)) or "(none)"
    answer = case.answer if case.answer is not None else "(none)"
    shots = f"\n\nThe last {len(case.screenshots)} screenshot(s) follow, oldest first." if case.screenshots else ""
    return (f"Task: {case.intent}\n\nActions taken:\n{actions}\n\nThe last page the agent saw (text):\n{case.page}"
            f"\n\nFinal answer: {answer}{shots}")


def parse_verdict(reply: str) -> bool | None:
    """PAE's reading: success iff the reply contains "SUCCESS" and not "NOT SUCCESS" (so "NOT SUCCESS", which
    contains "SUCCESS", is a failure); None when it contains neither (no verdict). Capitals only, as the prompt asks,
    so "successfully" in the reasoning is no verdict."""
    if re.search(r"NOT\s+SUCCESS", reply):  # PAE's "NOT SUCCESS", also across a line break
        return False
    if SUCCESS in reply:
        return True
    return None


def png_data_url(path: str | os.PathLike) -> str:
    """A PNG file as a ``data:image/png;base64,...`` URL (refuses a file that is not a PNG)."""
    data = Path(path).read_bytes()
    if not data.startswith(PNG_SIGNATURE):
        raise ValueError(f"{path} is not a PNG file (reward.judge_screenshots sends the rollout's PNG screenshots)")
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


class EndpointJudge:
    """The judge on an OpenAI-compatible ``/chat/completions`` endpoint (module docstring). The SDK retries
    timeouts, connection errors, 429 and 5xx ``retries`` times; no API key in the environment: no Authorization
    header."""

    def __init__(self, base_url: str, model: str, api_key_env: str = "OPENAI_API_KEY", timeout_s: float = 120.0,
                 retries: int = 2, concurrency: int = ENDPOINT_CONCURRENCY):
        self.base_url = base_url.rstrip("/")
        self.model, self.api_key_env = model, api_key_env
        self.timeout_s, self.retries, self.concurrency = timeout_s, retries, max(1, concurrency)

    @property
    def name(self) -> str:
        """The judge's identity in the scores table (``model_id``)."""
        return self.model

    def __repr__(self) -> str:
        return f"EndpointJudge({self.base_url!r}, model={self.model!r})"

    def messages(self, case: JudgeCase) -> list[dict]:
        """[system, user]: text alone, or text then one ``image_url`` part per screenshot."""
        text = judge_user_text(case)
        content: str | list[dict] = text
        if case.screenshots:
            content = [{"type": "text", "text": text}] + [
                {"type": "image_url", "image_url": {"url": png_data_url(p)}} for p in case.screenshots]
        return [{"role": "system", "content": judge_system(ENDPOINT_CLOSING, bool(case.screenshots))},
                {"role": "user", "content": content}]

    def judge(self, cases: Sequence[JudgeCase]) -> list[Verdict]:
        """One verdict per case, in order (asked concurrently)."""
        if not cases:
            return []
        verdicts = asyncio.run(self._judge_all(list(cases)))
        if all(v.p_success is None for v in verdicts):
            raise OutcomeJudgeError(
                f"outcome judge {self.base_url} (model {self.model}, reward.judge) gave no SUCCESS / NOT SUCCESS "
                f"verdict on any of {len(cases)} episode(s); first reply: {verdicts[0].note!r}")
        return verdicts

    async def _judge_all(self, cases: list[JudgeCase]) -> list[Verdict]:
        import openai  # ~0.5 s to import: only a configured endpoint judge needs it

        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        # no key: no Authorization header (the SDK insists on a key, so it gets one it never sends)
        no_auth = {} if key else {"extra_headers": {"Authorization": openai.Omit()}}
        gate = asyncio.Semaphore(self.concurrency)
        async with openai.AsyncOpenAI(base_url=self.base_url, api_key=key or "unused", timeout=self.timeout_s,
                                      max_retries=self.retries) as client:
            async def ask(case: JudgeCase) -> Verdict:
                async with gate:
                    try:
                        reply = await client.chat.completions.create(model=self.model, messages=self.messages(case),
                                                                     **ENDPOINT_SAMPLING, **no_auth)
                        content = reply.choices[0].message.content
                    except (openai.APIError, AttributeError, IndexError, TypeError, ValueError) as e:
                        key_note = (f"API key from ${self.api_key_env} (reward.judge_api_key_env)" if key else
                                    f"no API key: ${self.api_key_env} (reward.judge_api_key_env) is not set")
                        raise OutcomeJudgeError(
                            f"outcome judge {self.base_url} (model {self.model}, reward.judge) failed on episode "
                            f"{case.episode_id} after up to {self.retries + 1} tries, {key_note}: {e!r}") from None
                text = content if isinstance(content, str) else ""
                ok = parse_verdict(text)
                return Verdict(None if ok is None else float(ok), text[-2000:])

            return list(await asyncio.gather(*(ask(c) for c in cases)))


class LocalJudge:
    """A local causal LM asked zero-shot in process (module docstring): P(success) = P(YES) after the evidence
    rendered through the model's chat template (a model without one gets a plain "System / User / Answer"
    layout). The page is cut further when the prompt exceeds ``models.max_length`` tokens, never the question."""

    def __init__(self, model_path: str | os.PathLike | None = None, models_cfg: ModelsConfig | None = None, *,
                 batch_size: int = LOCAL_BATCH_SIZE, model=None, tokenizer=None):
        from webrl_core.learn.orm import OrmScorer  # torch: only a local judge needs it

        self.models_cfg = models_cfg or ModelsConfig()
        self.batch_size = batch_size
        self.path = str(model_path) if model_path is not None else getattr(tokenizer, "name_or_path", "model")
        self.scorer = OrmScorer(model_path, OrmConfig(batch_size=batch_size), self.models_cfg, model=model,
                                tokenizer=tokenizer)
        self.tok = self.scorer.tok

    @property
    def name(self) -> str:
        """The judge's identity in the scores table (``model_id``): the model folder's name."""
        return Path(self.path).name

    def __repr__(self) -> str:
        return f"LocalJudge({self.path!r})"

    def _render(self, case: JudgeCase, page: str) -> str:
        system = judge_system(LOCAL_CLOSING, False)
        user = judge_user_text(JudgeCase(case.episode_id, case.intent, case.actions, page, case.answer))
        if getattr(self.tok, "chat_template", None):
            return self.tok.apply_chat_template([{"role": "system", "content": system},
                                                 {"role": "user", "content": user}],
                                                tokenize=False, add_generation_prompt=True)
        return f"System: {system}\n\nUser: {user}\n\nAnswer:"

    def prompt(self, case: JudgeCase) -> str:
        """The case's prompt string, its page cut until it fits ``models.max_length`` tokens."""
        from webrl_core.learn.models import prompt_token_ids

        room, page = self.models_cfg.max_length, case.page
        while True:
            text = self._render(case, page)
            n = len(prompt_token_ids(self.tok, text))
            if n <= room:
                return text
            if not page:
                raise ValueError(f"the outcome judge's prompt for episode {case.episode_id} needs {n} tokens without "
                                 f"any page; raise models.max_length (now {room})")
            # drop the excess tokens' worth of characters (by this prompt's chars per token), a little more
            per_token = len(text) / n
            page = page[:max(0, len(page) - int((n - room + 8) * per_token) - 1)]

    def p_success(self, cases: Sequence[JudgeCase], batch_size: int | None = None) -> list[float]:
        """P(YES) per case (batched, no grad: ``OrmScorer.p_yes``)."""
        return self.scorer.p_yes([self.prompt(c) for c in cases], batch_size or self.batch_size)

    def judge(self, cases: Sequence[JudgeCase]) -> list[Verdict]:
        return [Verdict(p, f"P(YES)={p:.4f}") for p in self.p_success(cases)]


def outcome_judge_from_settings(settings) -> EndpointJudge | LocalJudge:
    """The judge ``reward.judge`` names (``settings``: WebRLSettings or a stage's view with ``reward``, and
    ``models`` for a local judge): an http(s) URL -> ``EndpointJudge`` with ``reward.judge_model`` and the key in
    ``$<reward.judge_api_key_env>``; anything else a local model (short name or HF folder) -> ``LocalJudge``."""
    rw = settings.reward
    ref = (rw.judge or "").strip()
    if not ref:
        raise ValueError("reward.source: judge needs reward.judge: an OpenAI-compatible endpoint (e.g. "
                         "http://127.0.0.1:8000/v1) or a local model (a short name such as smollm2-135m-instruct, "
                         "or an HF folder)")
    url = urlparse(ref)
    if url.scheme in ("http", "https"):
        if not url.netloc:
            raise ValueError(f"reward.judge: {ref!r} is no endpoint URL (expected e.g. http://127.0.0.1:8000/v1)")
        return EndpointJudge(ref, model=rw.judge_model, api_key_env=rw.judge_api_key_env)
    if rw.judge_screenshots:
        raise ValueError(f"reward.judge_screenshots={rw.judge_screenshots} needs an endpoint judge (a VLM served at "
                         f"an http(s) URL); the local judge {ref!r} reads text only: set reward.judge_screenshots: 0")
    folder = resolve_model_ref(ref)
    try:
        return LocalJudge(folder, settings.models)
    except WebrlError as e:  # a missing or broken folder, already explained: keep its kind (the CLI's exit code)
        raise type(e)(f"reward.judge {ref!r}: {e}") from e
