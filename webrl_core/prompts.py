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

ORM prompt: a system text, then ``The User Intent:`` / ``Action History:`` (one line per raw response,
internal newlines folded to "; ") / ``The Current Screenshot:`` + the HTML of the last step; the HTML
is cut so the whole prompt fits ``max_html_chars``; the question is never cut. The model answers YES/NO.

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

import functools
import json
from pathlib import Path
from typing import Any

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
OFFICIAL_FORMAT_FILE = Path(__file__).with_name("prompt_formats") / "official.json"


def check_compat(compat: str) -> str:
    """``compat`` itself if it is a known prompt format, else ValueError naming it and the allowed ones."""
    if compat not in COMPATS:
        raise ValueError(f"prompt compat {compat!r} is unknown; allowed: {', '.join(map(repr, COMPATS))}")
    return compat


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
                 compat: str = "webrl") -> str:
    """The completion prompt for the next action (see module docstring); ``compat``: "webrl" or "official"."""
    if check_compat(compat) == "official":
        return _official_prompt(intent, past_responses, html, budget)
    head = f"Task Instruction: {intent}\n\n"
    for i, resp in enumerate(past_responses):
        head += _round(i, intent if i == 0 else HTML_PLACEHOLDER, resp)
    k = len(past_responses)
    restated = f"\n\nTask Instruction: {intent}" if compat == "webrl_restated" else ""
    shell = head + _round(k, restated, None)
    room = max(0, budget - len(shell))
    return head + _round(k, html[:room] + restated, None)


def round0_prompt(intent: str, start_html: str, budget: int = DEFAULT_BUDGET, *, compat: str = "webrl") -> str:
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
                        budget: int = DEFAULT_BUDGET, *, compat: str = "webrl") -> list[dict[str, str]]:
    """Chat variant: same elided history as user/assistant turns, current HTML in the last user turn.
    ``compat="official"``: the official chat messages, whose HTML is never cut (``budget`` is not used)."""
    if check_compat(compat) == "official":
        return _official_chat(intent, past_responses, html)
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
    msgs.append({"role": "user", "content": head + html[:room]})
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
                     compat: str = "webrl") -> str:
    """ORM input (the outcome-supervised reward model, paper Sec. 3.2), Llama-3 style headers built by hand; the HTML
    is cut, never the question. ``compat="official"``: the released ORM's exact input (see module docstring)."""
    if check_compat(compat) == "official":
        return _official_orm(intent, responses, final_html, max_chars)
    history = "\n".join(fold_response(r) for r in responses)
    head = (f"{BOS}{SYSTEM_HEADER}\n\n{ORM_SYSTEM}{EOT}<|start_header_id|>user<|end_header_id|>\n\n"
            f"The User Intent:\n{intent}\n\nAction History:\n{history}\n\nThe Current Screenshot:\n")
    tail = f"{EOT}<|start_header_id|>assistant<|end_header_id|>\n\n"
    room = max(0, max_chars - len(head) - len(tail))
    return head + final_html[:room] + tail
