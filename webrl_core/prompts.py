"""The one WebRL prompt builder: the prompt format of the official WebRL code (arXiv 2411.02337).

Invariant (official code): rollout, ORM, perplexity, critic and training all see byte-identical
prompt strings, so every stage calls these functions and nothing else builds prompts.

Completion prompt for step k of an episode with intent I, past raw responses a_0..a_{k-1} and
current simplified HTML h_k::

    Task Instruction: I\n\n
    Round 0\n\n<U>\nI\n\n<A>\na_0\n\n                      (round 0 shows the intent again)
    Round i\n\n<U>\n** Simplified html **\n\n<A>\na_i\n\n  (1 <= i < k: past HTML is never shown)
    Round k\n\n<U>\nh_k\n\n<A>\n                         (current HTML, cut to the budget)

with <U> = ``<|eot_id|><|start_header_id|>user<|end_header_id|>`` and <A> the assistant header.
Budget: if len(prompt without HTML) + len(h_k) > budget characters, h_k is cut to the remainder.
Actions end with the stop token ``<|eot_id|>``.

Formats for small models (``prompt.style`` and ``prompt.observation``; ``PromptFormat``), the official layout
untouched:

* ``observation: compact`` shows h_k as ``compact_page.compact_page(h_k)`` (one line per block, ``[N] text`` per
  interactive element: about half the tokens of the HTML); ``compact_id_after`` writes ``text [N]`` instead;
* ``observation: X+screenshot`` (X one of the three above) is X, and the chat messages sent to an OpenAI-compatible
  endpoint carry the step's screenshot (a PNG of the viewport, taken when the page settled) as an ``image_url`` part
  after the text of the current user turn; ``observation: screenshot`` is the screenshot instead of the page: the
  text keeps the intent and the history, h_k is empty. PAE (arXiv 2412.13194) acts on Set-of-Marks screenshots; the
  part is the one BrowserGym's agents send (AgentLab ``dynamic_prompting.Observation.add_screenshot``:
  ``{"type": "image_url", "image_url": {"url": "data:image/...;base64,..."}}`` after the text). Every prompt string
  (stored steps, critic, training) is text only: the X part; the ORM, a text model, reads the HTML of the end state
  where ``screenshot`` leaves no page text;
* ``style: chat`` with a local actor renders the same rounds through the actor tokenizer's own chat template
  (SmolLM2: ``<|im_start|>user ... <|im_end|>``), once, as the prompt string: a short system line, round 0's user
  turn ``Task: I``, later past rounds the placeholder, each a_i an assistant turn, the current user turn
  ``h_k\n\nTask: I``, then the template's assistant opener. The stop token is the tokenizer's EOS, which closes
  the template's assistant turns.

ORM prompt: a system text, then ``The User Intent:`` / ``Action History:`` (one line per raw response,
internal newlines folded to "; ") / ``The Current Screenshot:`` + the HTML of the last step; the HTML
is cut so the whole prompt fits ``max_html_chars``; the question is never cut. The model answers YES/NO. With
the run's ``PromptFormat`` the ORM reads the end state as the actor reads its pages: the compact page, and with
``style: chat`` the system text and the question as turns of the model's own chat template.

Two formats (``prompt.compat``; every builder takes ``compat=``, default ``"webrl"``):

* ``"webrl"`` (default, for the models we train): the layout above in our wording. The completion prompt has the
  official layout; the budget counts the whole prompt shell; the chat messages and the ORM system text are ours.
* ``"webrl_restated"``: ``"webrl"`` with the current round ending in ``\n\nTask Instruction: I`` after h_k, right
  before the action (completion prompt only; chat and ORM as ``"webrl"``). A small model trained from scratch then
  copies a name from the intent a few tokens back instead of across the whole page (the embedded default's choice).
* ``"official"``: the exact input strings the released checkpoints (WebRL-Llama-3.1-8B actor, the WebRL ORM) were
  trained on, so they can be dropped in. The strings are data, read once from ``prompt_formats/official.json``,
  where each one names its source:

  - actor (completion): VisualAgentBench ``VAB-WebArena-Lite/new/prompt_constructor.py``
    ``WebRLPromptConstructor.construct`` (= WebRL ``scripts/process_data.py`` ``build_policy_data.format_prompt``),
    no system prompt (``p_webrl.json`` intro is empty). Cut rule: if len(history) + len(h_k) > budget, h_k is cut to
    budget - len(history) (the task line and the current round's headers are not counted);
  - chat variant: ``WebRLChatPromptConstructor.construct`` with the system text of ``p_webrl_chat.json``; no cut
    (the official run has ``--max_obs_length 0``); as there, the messages of the first step (no past round)
    do not contain the intent at all;
  - ORM: WebRL ``scripts/process_data.py`` ``build_rm_data`` (system text, ``rm_format``) and ``add_overall_reward``
    (the Llama-3 wrapper). Intent and HTML are stripped; each response's lines (split on "\n", empty ones kept)
    are joined with "; " and stripped. Our character budget still applies: an ORM prompt longer than
    ``max_chars`` has its HTML cut (the official code instead kept the first 16384 tokens).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from webrl_core.compact_page import compact_page

EOT = "<|eot_id|>"
BOS = "<|begin_of_text|>"
USER_HEADER = "<|eot_id|><|start_header_id|>user<|end_header_id|>"
ASSISTANT_HEADER = "<|eot_id|><|start_header_id|>assistant<|end_header_id|>"
SYSTEM_HEADER = "<|start_header_id|>system<|end_header_id|>"
HTML_PLACEHOLDER = "** Simplified html **"
STOP_TOKEN = EOT
# Tokens the embedded tokenizer must treat as atomic.
SPECIAL_TOKENS = ["<pad>", BOS, EOT, "<|start_header_id|>", "<|end_header_id|>"]
DEFAULT_BUDGET = 16384 - 512

COMPATS = ("webrl", "official", "webrl_restated")
STYLES = ("completion", "chat")
TEXT_OBSERVATIONS = ("html", "compact", "compact_id_after")
SCREENSHOT = "screenshot"
SCREENSHOT_SUFFIX = "+" + SCREENSHOT
OBSERVATIONS = (*TEXT_OBSERVATIONS, *(o + SCREENSHOT_SUFFIX for o in TEXT_OBSERVATIONS), SCREENSHOT)
OFFICIAL_FORMAT_FILE = Path(__file__).with_name("prompt_formats") / "official.json"


def check_compat(compat: str) -> str:
    """``compat`` itself if it is a known prompt format, else ValueError naming it and the allowed ones."""
    if compat not in COMPATS:
        raise ValueError(f"prompt compat {compat!r} is unknown; allowed: {', '.join(map(repr, COMPATS))}")
    return compat


@dataclass(frozen=True)
class PromptFormat:
    """How the actor's prompt is laid out (``prompt.*``); passed wherever a ``compat`` name is accepted.

    ``chat_template`` (with ``bos_token``/``eos_token``) is the actor tokenizer's own Jinja chat template, taken
    when ``style == "chat"`` (``prompt_format``): the prompt is then rendered through it as a string, so every
    stage sees byte-identical text with the model's real special tokens instead of Llama-3 header text."""

    compat: str = "webrl"
    style: str = "completion"
    observation: str = "html"
    chat_template: str | None = None
    bos_token: str = ""
    eos_token: str = ""

    def __post_init__(self) -> None:
        check_compat(self.compat)
        if self.style not in STYLES:
            raise ValueError(f"prompt.style {self.style!r} is unknown; allowed: {', '.join(map(repr, STYLES))}")
        if self.observation not in OBSERVATIONS:
            raise ValueError(f"prompt.observation {self.observation!r} is unknown; allowed: "
                             f"{', '.join(map(repr, OBSERVATIONS))}")

    @property
    def framed(self) -> bool:
        """The completion prompt is rendered through the model's chat template (a string ready to tokenise)."""
        return self.style == "chat" and self.chat_template is not None

    @property
    def key(self) -> str:
        """Identity of the layout: ``compat`` alone for the completion layouts on HTML (the keys episodes had
        before the other options existed), else every field, the template by digest."""
        if not self.framed and self.observation == "html":
            return self.compat
        tpl = hashlib.sha256((self.chat_template or "").encode()).hexdigest()[:12] if self.framed else "-"
        return f"{self.compat}/{self.style}/{self.observation}/{tpl}"

    @property
    def screenshot(self) -> bool:
        """The step's screenshot is part of the observation (an image part of the chat messages)."""
        return observes_screenshot(self.observation)

    @property
    def text_observation(self) -> str | None:
        """The page text of the observation: ``X`` of ``X+screenshot``; None for ``screenshot`` alone."""
        return None if self.observation == SCREENSHOT else self.observation.removesuffix(SCREENSHOT_SUFFIX)

    def page(self, html: str) -> str:
        """The observation's page text as this format shows it ("" when the screenshot replaces the page)."""
        text = self.text_observation
        if text is None:
            return ""
        if text == "html":
            return html
        return compact_page(html, id_after=text == "compact_id_after")


def observes_screenshot(observation: str) -> bool:
    """Whether ``prompt.observation`` sends the step's screenshot."""
    return observation == SCREENSHOT or observation.endswith(SCREENSHOT_SUFFIX)


def check_screenshot_input(observation: str, backend: str, style: str) -> None:
    """ValueError naming ``prompt.observation`` and the backend when the observation holds a screenshot the policy
    cannot be given: only an OpenAI-compatible chat endpoint (``policy.backend: openai`` with ``prompt.style:
    chat``) takes image parts. An in-process HF model has no image input, and ``/completions`` takes a text prompt.
    Scripted backends (oracle, random) read no observation and pass."""
    if not observes_screenshot(observation):
        return
    text = ", ".join(map(repr, TEXT_OBSERVATIONS))
    if backend == "hf":
        raise ValueError(f"prompt.observation={observation!r} sends the step's screenshot as an image, but "
                         f"policy.backend='hf' is an in-process text model without image input: serve a "
                         f"vision-language model (e.g. vLLM serving Qwen2.5-VL) and set policy.backend: openai, "
                         f"policy.base_url, policy.model_name and prompt.style: chat, or use a text observation "
                         f"({text})")
    if backend == "openai" and style != "chat":
        raise ValueError(f"prompt.observation={observation!r} sends the step's screenshot as an image part, but "
                         f"policy.backend='openai' with prompt.style={style!r} calls /completions, which takes a "
                         f"text prompt only: set prompt.style: chat (/chat/completions), or use a text observation "
                         f"({text})")


def screenshot_part(png: bytes) -> dict[str, Any]:
    """An OpenAI chat content part holding a PNG screenshot as a base64 data URL."""
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()}}


def as_format(compat: str | PromptFormat) -> PromptFormat:
    """A ``PromptFormat`` for a compat name (the completion layout on HTML) or the format itself."""
    return compat if isinstance(compat, PromptFormat) else PromptFormat(compat=check_compat(compat))


def prompt_format(settings, tokenizer=None) -> PromptFormat:
    """The run's actor prompt format from ``settings.prompt``; ``style: chat`` reads the chat template of the
    actor's tokenizer (``tokenizer``, else ``models.actor``'s folder). A model without one keeps the messages path
    (``build_chat_messages``, for OpenAI-compatible servers that apply their own template)."""
    p = settings.prompt
    template = bos = eos = None
    if p.style == "chat":
        if tokenizer is not None:
            template, bos, eos = _template_of(tokenizer)
        elif getattr(settings.models, "actor", None):
            template, bos, eos = _folder_template(str(settings.models.actor))
    return PromptFormat(compat=p.compat, style=p.style, observation=p.observation, chat_template=template,
                        bos_token=bos or "", eos_token=eos or "")


def _template_of(tok) -> tuple[str | None, str | None, str | None]:
    template = getattr(tok, "chat_template", None)
    if isinstance(template, dict):  # several named templates: the default one
        template = template.get("default")
    return template, getattr(tok, "bos_token", None), getattr(tok, "eos_token", None)


@functools.lru_cache(maxsize=8)
def _folder_template(folder: str) -> tuple[str | None, str | None, str | None]:
    from transformers import AutoTokenizer  # the template only: no model code needed here

    try:
        return _template_of(AutoTokenizer.from_pretrained(folder))  # config resolves short names to folders
    except (OSError, ValueError):
        return None, None, None  # a served model: its server applies the template


@functools.cache
def _template(source: str):
    from jinja2.sandbox import ImmutableSandboxedEnvironment  # the environment transformers renders templates in

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(source)


def render_chat(fmt: PromptFormat, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
    """``messages`` through the format's chat template, as ``tokenizer.apply_chat_template(tokenize=False)``."""
    return _template(fmt.chat_template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                               bos_token=fmt.bos_token, eos_token=fmt.eos_token)


SMALL_CHAT_SYSTEM = "You are a web agent. Reply with one action on the current page."


def _framed_messages(fmt: PromptFormat, intent: str, past_responses: list[str], page: str,
                     budget: int) -> list[dict[str, str]]:
    """The rounds of the completion layout as chat turns for the model's own template: round 0's user turn is the
    intent, later past rounds show the HTML placeholder, each past response is an assistant turn; the current
    user turn is the page followed by the intent again (a small model copies names from a few tokens back, as
    ``webrl_restated``). The page is cut so that the rendered prompt fits ``budget`` characters."""
    msgs = [{"role": "system", "content": SMALL_CHAT_SYSTEM}]
    for i, resp in enumerate(past_responses):
        msgs += [{"role": "user", "content": f"Task: {intent}" if i == 0 else HTML_PLACEHOLDER},
                 {"role": "assistant", "content": resp}]
    tail = f"\n\nTask: {intent}"
    shell = render_chat(fmt, msgs + [{"role": "user", "content": tail}])
    room = max(0, budget - len(shell))
    return msgs + [{"role": "user", "content": page[:room] + tail}]


@functools.cache
def official_format() -> dict[str, Any]:
    """The official strings by name (``prompt_formats/official.json``, loaded once; each entry's ``source`` there
    names the official file it comes from)."""
    data = json.loads(OFFICIAL_FORMAT_FILE.read_text(encoding="utf-8"))
    return {name: entry["text"] for name, entry in data["strings"].items()}


def _official_prompt(intent: str, past_responses: list[str], html: str, budget: int) -> str:
    f = official_format()
    history = "".join(f["completion_round0" if i == 0 else "completion_round"].format(i=i, intent=intent,
                                                                                      previous_action=resp)
                      for i, resp in enumerate(past_responses))
    obs = html
    if len(history) + len(obs) > budget:  # the official rule, a negative remainder included
        obs = obs[:budget - len(history)]
    current = f["completion_current_round"].format(index=len(past_responses), obs=obs)
    return f["completion_prompt"].format(intent=intent, history=history, current_turn=current)


def _official_chat(intent: str, past_responses: list[str], html: str) -> list[dict[str, str]]:
    f = official_format()
    msgs = [{"role": "system", "content": f["chat_system"]}]
    for i, resp in enumerate(past_responses):
        user = f["chat_round0_user" if i == 0 else "chat_round_user"].format(i=i, intent=intent)
        msgs += [{"role": "user", "content": user},
                 {"role": "assistant", "content": f["chat_round_assistant"].format(previous_action=resp)}]
    msgs.append({"role": "user", "content": f["chat_current_user"].format(index=len(past_responses), obs=html)})
    return msgs


def _official_orm(intent: str, responses: list[str], final_html: str, max_chars: int) -> str:
    f = official_format()
    head = f["orm_instruction_head"].format(intent=intent.strip())
    for r in responses:
        head += f["orm_history_line"].format(response=f["orm_history_join"].join(r.split("\n")).strip())
    html = final_html.strip()

    def render(h: str) -> str:
        instruction = head + f["orm_instruction_tail"].format(html=h)
        return f["orm_prompt"].format(system=f["orm_system"], instruction=instruction)

    room = max(0, max_chars - len(render("")))
    return render(html[:room])


def _round(i: int, user: str, response: str | None) -> str:
    block = f"Round {i}\n\n{USER_HEADER}\n{user}\n\n{ASSISTANT_HEADER}\n"
    if response is not None:
        block += f"{response}\n\n"
    return block


def build_prompt(intent: str, past_responses: list[str], html: str, budget: int = DEFAULT_BUDGET, *,
                 compat: str | PromptFormat = "webrl") -> str:
    """The prompt for the next action (see module docstring); ``compat``: a compat name ("webrl", "official",
    "webrl_restated") or a ``PromptFormat`` (compact page, the model's chat template)."""
    fmt = as_format(compat)
    compat, html = fmt.compat, fmt.page(html)
    if fmt.framed:  # the template's assistant opener ends it
        return render_chat(fmt, _framed_messages(fmt, intent, past_responses, html, budget))
    if compat == "official":
        return _official_prompt(intent, past_responses, html, budget)
    head = f"Task Instruction: {intent}\n\n"
    for i, resp in enumerate(past_responses):
        head += _round(i, intent if i == 0 else HTML_PLACEHOLDER, resp)
    k = len(past_responses)
    restated = f"\n\nTask Instruction: {intent}" if compat == "webrl_restated" else ""
    shell = head + _round(k, restated, None)
    room = max(0, budget - len(shell))
    return head + _round(k, html[:room] + restated, None)


def round0_prompt(intent: str, start_html: str, budget: int = DEFAULT_BUDGET, *,
                  compat: str | PromptFormat = "webrl") -> str:
    """The Round-0 prompt on the start page: what the critic scores to filter new tasks."""
    return build_prompt(intent, [], start_html, budget, compat=compat)


CHAT_SYSTEM = (
    "# Setup\n"
    "You are a web agent. Each turn you see a simplified HTML page in which interactive elements carry "
    "numeric ids, and you write exactly one line of Python-like code that acts on the page.\n\n"
    "# Actions\n"
    'do(action="Click", element="N")\n'
    'do(action="Type", argument="text", element="N")\n'
    'do(action="Search", argument="text", element="N")\n'
    'do(action="Hover", element="N")\n'
    'do(action="Scroll Up") / do(action="Scroll Down")\n'
    'do(action="Press Enter")\n'
    'do(action="Select Dropdown Option", argument="option text", element="N")\n'
    'do(action="Go backward") / do(action="Go forward")\n'
    'exit(message="answer")  # finish, with the answer if the task asks a question\n\n'
    "# Rules\n"
    "- one line of code per turn, optionally preceded by '# Element: ...' and '# Note: ...' comment lines;\n"
    "- use only ids visible in the current page; element is required for element actions;\n"
    "- never use the address bar; do not wrap code in fences; if stuck in a loop, try something else."
)


def build_chat_messages(intent: str, past_responses: list[str], html: str,
                        budget: int = DEFAULT_BUDGET, *, compat: str | PromptFormat = "webrl",
                        screenshot: bytes | None = None) -> list[dict[str, Any]]:
    """Chat variant: same elided history as user/assistant turns, current page in the last user turn. A framed
    format (``prompt.style: chat`` with the model's template): the turns that ``build_prompt`` renders, so a served
    model that applies the same template reads the same text as the in-process policy.
    ``compat``: a compat name (the page is ``html`` as given) or a ``PromptFormat``, whose observation shows the
    page (the compact page; nothing of it for ``screenshot``). ``compat="official"``: the official chat messages,
    whose page is never cut (``budget`` is not used).

    ``screenshot``: the PNG of the current page; the last user turn's content is then the list ``[text part,
    image_url part]`` (OpenAI's content parts, as BrowserGym's agents send them; see the module docstring), the
    text part exactly the string it holds without one."""
    fmt = as_format(compat)
    page = fmt.page(html)
    if fmt.framed:  # the turns ``build_prompt`` renders: a served model's template makes the same text of them
        msgs = _framed_messages(fmt, intent, past_responses, page, budget)
    elif fmt.compat == "official":
        msgs = _official_chat(intent, past_responses, page)
    else:
        msgs = [{"role": "system", "content": CHAT_SYSTEM}]
        for i, resp in enumerate(past_responses):
            user = f"Round {i}\n\n{intent if i == 0 else HTML_PLACEHOLDER}"
            if i == 0:
                user = f"Task Instruction: {intent}\n\n{user}"
            msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": resp}]
        used = sum(len(m["content"]) for m in msgs)
        head = f"Round {len(past_responses)}\n\n"
        if not past_responses:
            head = f"Task Instruction: {intent}\n\n{head}"
        room = max(0, budget - used - len(head))
        msgs.append({"role": "user", "content": head + page[:room]})
    if screenshot is not None:
        msgs[-1] = {**msgs[-1], "content": [{"type": "text", "text": msgs[-1]["content"]},
                                            screenshot_part(screenshot)]}
    return msgs


ORM_SYSTEM = (
    "You judge whether a web-navigation agent completed a user's task. You are given the user's intent, "
    "the agent's action history and the final state of the page. Decide whether the task was accomplished. "
    "You must respond with YES or NO."
)


def fold_response(response: str) -> str:
    """One history line per step: the raw response with internal newlines folded to '; '."""
    return "; ".join(line for line in response.strip().splitlines() if line.strip())


def build_orm_prompt(intent: str, responses: list[str], final_html: str, max_chars: int = 12000, *,
                     compat: str | PromptFormat = "webrl") -> str:
    """ORM input (the outcome-supervised reward model, paper Sec. 3.2); the page is cut, never the question.
    ``compat``: a compat name, the completion layout on HTML with Llama-3 style headers built by hand
    ("official": the released ORM's exact input), or a ``PromptFormat``: its observation (the compact page) is
    what the ORM reads of the end state, and a framed format (``style: chat``) renders the same system text and
    question through the model's own chat template, as the actor reads its pages."""
    fmt = as_format(compat)
    # a text model: where the screenshot replaces the page, the ORM reads the HTML (the official ORM input)
    page = fmt.page(final_html) if fmt.text_observation is not None else final_html
    if fmt.compat == "official":
        return _official_orm(intent, responses, page, max_chars)
    history = "\n".join(fold_response(r) for r in responses)
    question = f"The User Intent:\n{intent}\n\nAction History:\n{history}\n\nThe Current Screenshot:\n"
    if fmt.framed:
        def framed(shown: str) -> str:
            return render_chat(fmt, [{"role": "system", "content": ORM_SYSTEM},
                                     {"role": "user", "content": question + shown}])
        return framed(page[:max(0, max_chars - len(framed("")))])
    head = f"{BOS}{SYSTEM_HEADER}\n\n{ORM_SYSTEM}{EOT}<|start_header_id|>user<|end_header_id|>\n\n{question}"
    tail = f"{EOT}<|start_header_id|>assistant<|end_header_id|>\n\n"
    room = max(0, max_chars - len(head) - len(tail))
    return head + page[:room] + tail
