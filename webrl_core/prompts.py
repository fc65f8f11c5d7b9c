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
"""

from __future__ import annotations

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


def _round(i: int, user: str, response: str | None) -> str:
    block = f"Round {i}\n\n{USER_HEADER}\n{user}\n\n{ASSISTANT_HEADER}\n"
    if response is not None:
        block += f"{response}\n\n"
    return block


def build_prompt(intent: str, past_responses: list[str], html: str, budget: int = DEFAULT_BUDGET) -> str:
    """The completion prompt for the next action (see module docstring)."""
    head = f"Task Instruction: {intent}\n\n"
    for i, resp in enumerate(past_responses):
        head += _round(i, intent if i == 0 else HTML_PLACEHOLDER, resp)
    k = len(past_responses)
    shell = head + _round(k, "", None)
    room = max(0, budget - len(shell))
    return head + _round(k, html[:room], None)


def round0_prompt(intent: str, start_html: str, budget: int = DEFAULT_BUDGET) -> str:
    """The Round-0 prompt on the start page: what the critic scores to filter new tasks."""
    return build_prompt(intent, [], start_html, budget)


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
                        budget: int = DEFAULT_BUDGET) -> list[dict[str, str]]:
    """Chat variant: same elided history as user/assistant turns, current HTML in the last user turn."""
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


def build_orm_prompt(intent: str, responses: list[str], final_html: str, max_chars: int = 12000) -> str:
    """ORM input (the outcome-supervised reward model, paper Sec. 3.2), Llama-3 style headers built by hand; the HTML
    is cut, never the question."""
    history = "\n".join(fold_response(r) for r in responses)
    head = (f"{BOS}{SYSTEM_HEADER}\n\n{ORM_SYSTEM}{EOT}<|start_header_id|>user<|end_header_id|>\n\n"
            f"The User Intent:\n{intent}\n\nAction History:\n{history}\n\nThe Current Screenshot:\n")
    tail = f"{EOT}<|start_header_id|>assistant<|end_header_id|>\n\n"
    room = max(0, max_chars - len(head) - len(tail))
    return head + final_html[:room] + tail
