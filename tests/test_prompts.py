"""Prompt formats (``prompt.compat``): our default wording is unchanged, "official" renders the strings of
``webrl_core/prompt_formats/official.json`` (the released WebRL checkpoints' exact inputs), unknown formats fail."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re

import pytest

from webrl_core import prompts
from webrl_core.learn.orm import orm_examples_from_episodes, orm_prompt_for_episode
from webrl_core.prompts import (BOS, OFFICIAL_FORMAT_FILE, TEXT_OBSERVATIONS, PromptFormat, build_chat_messages,
                                build_orm_prompt, build_prompt, check_screenshot_input, round0_prompt)
from webrl_core.compact_page import compact_page
from webrl_core.learn.transitions import import_vab_traces

DATA = json.loads(OFFICIAL_FORMAT_FILE.read_text(encoding="utf-8"))
S = {k: v["text"] for k, v in DATA["strings"].items()}
U = "<|eot_id|><|start_header_id|>user<|end_header_id|>"
A = "<|eot_id|><|start_header_id|>assistant<|end_header_id|>"
R0 = '# Element: the search bar\ndo(action="Search", argument="lamp", element="3")'
R1 = 'do(action="Click", element="7")'


# --- the default format: byte-identical to the outputs computed before "compat" existed ------------------

def _sha(obj) -> str:
    return hashlib.sha256(json.dumps(obj).encode()).hexdigest()


def _default_outputs() -> dict:
    return {
        "build_prompt_2": build_prompt("Buy a lamp", [R0, R1], "<html>page2</html>"),
        "build_prompt_cut": build_prompt("Find {x}", ["a"], "0123456789" * 20, budget=150),
        "round0": round0_prompt("Buy a lamp", "<html>home</html>"),
        "chat_1": build_chat_messages("Buy a lamp", ['do(action="Scroll Down")'], "<html>p</html>"),
        "orm": build_orm_prompt("Buy a lamp", ['# Note: x\n\ndo(action="Click", element="7")', 'exit(message="done")'],
                                "<html>final</html>"),
        "orm_cut": build_orm_prompt("Buy a lamp", ["exit()"], "x" * 1000, max_chars=700),
    }


BEFORE = {  # sha256 of json.dumps(output), computed with the code before this change
    "build_prompt_2": "63411be944868707d56d307716e0971d7ed0c7a467ea92b90c8f510735470b02",
    "build_prompt_cut": "3f65715dcb59c5d6023395c8e31362bbaf95008fafba9d81e1da1cc22057ac46",
    "round0": "a39dbafae0a0b0c966717339e390ffe2002074f45023164bf652c8ec38f26ee7",
    "chat_1": "1eef24dfaf44859944b2a585763baf920dcc03696356d5dc09f303b979960971",
    "orm": "85c6ca21da77a666180787302654342614c9f7a2d2e4bf983b66f6e29f42ed84",
    "orm_cut": "ad3410142499a21df229e2e4571057434b08e255b1b986bfa48db92122131288",
}


def test_default_format_is_unchanged():
    out = _default_outputs()
    assert {k: _sha(v) for k, v in out.items()} == BEFORE
    assert out["build_prompt_2"] == (
        "Task Instruction: Buy a lamp\n\n"
        f"Round 0\n\n{U}\nBuy a lamp\n\n{A}\n{R0}\n\n"
        f"Round 1\n\n{U}\n** Simplified html **\n\n{A}\n{R1}\n\n"
        f"Round 2\n\n{U}\n<html>page2</html>\n\n{A}\n")
    assert out["orm"] == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou judge whether a web-navigation agent "
        "completed a user's task. You are given the user's intent, the agent's action history and the final state "
        "of the page. Decide whether the task was accomplished. You must respond with YES or NO.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nThe User Intent:\nBuy a lamp\n\nAction History:\n"
        '# Note: x; do(action="Click", element="7")\nexit(message="done")\n\nThe Current Screenshot:\n'
        "<html>final</html><|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    # compat="webrl" spelled out is the default
    assert build_prompt("Buy a lamp", [R0, R1], "<html>page2</html>", compat="webrl") == out["build_prompt_2"]
    assert build_chat_messages("Buy a lamp", ['do(action="Scroll Down")'], "<html>p</html>",
                               compat="webrl") == out["chat_1"]


def test_restated_format_repeats_the_intent_before_the_action():
    """``webrl_restated``: the default layout, the current round ending with the task line again; the budget counts
    it, so the page is cut first; chat and ORM prompts are the default ones."""
    plain = build_prompt("Buy a lamp", [R0, R1], "<html>page2</html>")
    restated = build_prompt("Buy a lamp", [R0, R1], "<html>page2</html>", compat="webrl_restated")
    assert restated == plain.replace("<html>page2</html>", "<html>page2</html>\n\nTask Instruction: Buy a lamp")
    assert restated.endswith(f"<html>page2</html>\n\nTask Instruction: Buy a lamp\n\n{A}\n")
    long_page = "<p>" + "x" * 5000 + "</p>"
    cut = build_prompt("Buy a lamp", [R0], long_page, budget=800, compat="webrl_restated")
    assert len(cut) == 800 and cut.endswith(f"\n\nTask Instruction: Buy a lamp\n\n{A}\n")
    assert round0_prompt("Buy a lamp", "<b>h</b>", compat="webrl_restated").count("Task Instruction:") == 2
    assert build_orm_prompt("Buy a lamp", [R0], "<b>f</b>", compat="webrl_restated") == \
        build_orm_prompt("Buy a lamp", [R0], "<b>f</b>")
    assert build_chat_messages("Buy a lamp", [R0], "<b>p</b>", compat="webrl_restated") == \
        build_chat_messages("Buy a lamp", [R0], "<b>p</b>")


# --- the data file ------------------------------------------------------------------------------------------

def test_official_data_file_names_its_sources():
    assert OFFICIAL_FORMAT_FILE.parent.name == "prompt_formats" and OFFICIAL_FORMAT_FILE.is_file()
    repos = {"https://github.com/THUDM/WebRL", "https://github.com/THUDM/VisualAgentBench"}
    for name, entry in DATA["strings"].items():
        src = entry["source"]
        assert src["repo"] in repos and src["path"] and src["where"] and len(src["commit"]) == 40, name
        assert entry["what"], name
    assert prompts.official_format() is prompts.official_format()  # loaded once
    assert prompts.official_format() == S
    # facts that the checkpoints depend on
    assert S["completion_system"] == "" and S["stop_token"] == prompts.STOP_TOKEN
    assert S["completion_obs_char_budget"] == 16384 - 512
    assert S["orm_system"].endswith("You must respond with YES or NO.") and S["orm_system"].count("\u2019") == 2
    assert S["chat_system"].startswith("# Setup\n")


# --- official: actor (completion) ---------------------------------------------------------------------------

def test_official_completion_prompt_is_the_data_strings():
    html = "<html>page2 {not a field}</html>"
    p = build_prompt("Buy a {red} lamp", [R0, R1], html, compat="official")
    task = S["completion_prompt"].split("{history}")[0].format(intent="Buy a {red} lamp")
    r0 = S["completion_round0"].format(i=0, intent="Buy a {red} lamp", previous_action=R0)
    r1 = S["completion_round"].format(i=1, previous_action=R1)
    cur = S["completion_current_round"].format(index=2, obs=html)
    assert p == task + r0 + r1 + cur
    assert task == "Task Instruction: Buy a {red} lamp\n\n" and "** Simplified html **" in r1
    assert p.endswith(f"{A}\n") and p.count("Round ") == 3
    # the same string the official prompt constructor gives (checked against the official code by hand)
    assert build_prompt("T", ["a"], "H", compat="official") == (
        f"Task Instruction: T\n\nRound 0\n\n{U}\nT\n\n{A}\na\n\nRound 1\n\n{U}\nH\n\n{A}\n")
    assert round0_prompt("T", "H", compat="official") == f"Task Instruction: T\n\nRound 0\n\n{U}\nH\n\n{A}\n"
    # no BOS: the server's tokenizer adds it, as in the official rollouts
    assert not p.startswith(BOS)


def test_official_cut_counts_history_and_html_only():
    hist = S["completion_round0"].format(i=0, intent="T", previous_action="a")
    budget = len(hist) + 50
    p = build_prompt("T", ["a"], "x" * 80, budget, compat="official")
    assert S["completion_current_round"].format(index=1, obs="x" * 50) in p  # cut to budget - len(history)
    assert "x" * 51 not in p
    assert build_prompt("T", ["a"], "x" * 50, budget, compat="official").count("x") == 50  # fits: not cut
    # ours counts the whole shell, so it keeps less
    assert build_prompt("T", ["a"], "x" * 80, budget).count("x") < 50


# --- official: chat variant ---------------------------------------------------------------------------------

def test_official_chat_messages():
    msgs = build_chat_messages("Buy", [R0, R1], "<html>p</html>", compat="official")
    assert msgs[0] == {"role": "system", "content": S["chat_system"]}
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert msgs[1]["content"] == S["chat_round0_user"].format(i=0, intent="Buy")
    assert msgs[1]["content"] == "Task Instruction: Buy\n\nRound 0\nBuy"
    assert msgs[3]["content"] == S["chat_round_user"].format(i=1) == "Round 1\n** Simplified html **"
    assert msgs[2]["content"] == R0 and msgs[4]["content"] == R1
    assert msgs[5]["content"] == S["chat_current_user"].format(index=2, obs="<html>p</html>")
    first = build_chat_messages("Buy", [], "y" * 20000, budget=100, compat="official")
    assert first[1] == {"role": "user", "content": "Round 0\n\n" + "y" * 20000}  # no cut; no intent (as official)


# --- official: ORM ------------------------------------------------------------------------------------------

def test_official_orm_prompt():
    responses = ["# Note: x\n\ndo(action=\"Click\", element=\"7\")  \n", "exit(message=\"done\")"]
    p = build_orm_prompt("  Buy a lamp \n", responses, "\n<html>final</html>\n", compat="official")
    instruction = (S["orm_instruction_head"].format(intent="Buy a lamp")
                   + S["orm_history_line"].format(response='# Note: x; ; do(action="Click", element="7")  ;')
                   + S["orm_history_line"].format(response='exit(message="done")')
                   + S["orm_instruction_tail"].format(html="<html>final</html>"))
    assert p == S["orm_prompt"].format(system=S["orm_system"], instruction=instruction)
    assert p.startswith(BOS + "<|start_header_id|>system<|end_header_id|>\n\nYou are an expert in evaluating")
    # lines split on "\n" (empty ones kept), joined with "; ", then stripped: the trailing "\n" leaves "  ;"
    assert ("The User Intent:\nBuy a lamp\n\nAction History:\n# Note: x; ; do(action=\"Click\", element=\"7\")  ;\n"
            "exit(message=\"done\")\n\nThe Current Screenshot:\n<html>final</html><|eot_id|>") in p
    assert p.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert p != build_orm_prompt("  Buy a lamp \n", responses, "\n<html>final</html>\n")


def test_official_orm_cut_keeps_the_question():
    full = build_orm_prompt("Buy", ["exit()"], "\u00a7" * 5000, max_chars=10 ** 6, compat="official")
    cut = build_orm_prompt("Buy", ["exit()"], "\u00a7" * 5000, max_chars=1200, compat="official")
    assert len(cut) == 1200 and cut.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert 0 < cut.count("\u00a7") < 5000
    assert full.replace("\u00a7" * 5000, "\u00a7" * cut.count("\u00a7")) == cut


def test_orm_episode_helpers_pass_compat():
    ep = {"episode_id": "e1", "intent": "Buy"}
    steps = [{"idx": 1, "response": "exit()", "html": "<b>2</b>"}, {"idx": 0, "response": R0, "html": "<b>1</b>"}]
    want = build_orm_prompt("Buy", [R0, "exit()"], "<b>2</b>", 12000, compat="official")
    assert orm_prompt_for_episode(ep, steps, compat="official") == want
    assert orm_prompt_for_episode(ep, steps) == build_orm_prompt("Buy", [R0, "exit()"], "<b>2</b>")
    ex = orm_examples_from_episodes([ep], {"e1": steps}, {"e1": True}, compat="official")
    assert ex == [{"episode_id": "e1", "prompt": want, "completion": "YES"}]


def test_import_vab_traces_passes_compat(tmp_path):
    (tmp_path / "traces").mkdir()
    lines = [{"trace_id": 3, "index": 0, "prompt": "Buy", "html": "<p>1</p>", "response": R0, "target": "Buy"},
             {"trace_id": 3, "index": 1, "prompt": "** Simplified html **", "html": "<p>2</p>", "response": R1,
              "target": "Buy"}]
    (tmp_path / "traces" / "3.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    [(_, steps)] = import_vab_traces(tmp_path, compat="official")
    assert [s["prompt"] for s in steps] == [build_prompt("Buy", [], "<p>1</p>", compat="official"),
                                            build_prompt("Buy", [R0], "<p>2</p>", compat="official")]
    [(_, default_steps)] = import_vab_traces(tmp_path)
    assert default_steps[1]["prompt"] == build_prompt("Buy", [R0], "<p>2</p>")


# --- screenshot observations (prompt.observation: X+screenshot, screenshot) ---------------------------------

PAGE = ('<html><body><a id="3" href="/forums">Forums</a><div>Posts</div><ul><li>Lamp 24 comments</li></ul>'
        '<input id="5" placeholder="Search"/></body></html>')
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(40))  # any bytes: the part carries them as they are


@pytest.mark.parametrize("text", TEXT_OBSERVATIONS)
@pytest.mark.parametrize("compat", ["webrl", "official", "webrl_restated"])
def test_a_screenshot_variant_keeps_the_text_of_its_observation(text, compat):
    plain = PromptFormat(compat=compat, observation=text)
    shot = PromptFormat(compat=compat, observation=text + "+screenshot")
    assert shot.screenshot and not plain.screenshot and shot.text_observation == text
    for past in ([], [R0], [R0, R1]):
        assert build_prompt("Buy a lamp", past, PAGE, compat=shot) == \
            build_prompt("Buy a lamp", past, PAGE, compat=plain)
        assert build_orm_prompt("Buy a lamp", past, PAGE, compat=shot) == \
            build_orm_prompt("Buy a lamp", past, PAGE, compat=plain)
        want = build_chat_messages("Buy a lamp", past, PAGE, compat=plain)
        assert build_chat_messages("Buy a lamp", past, PAGE, compat=shot) == want  # no screenshot given: text only
        got = build_chat_messages("Buy a lamp", past, PAGE, compat=shot, screenshot=PNG)
        assert got[:-1] == want[:-1] and got[-1]["role"] == want[-1]["role"] == "user"
        text_part, image_part = got[-1]["content"]
        assert text_part == {"type": "text", "text": want[-1]["content"]}
        assert image_part["type"] == "image_url"
        url = image_part["image_url"]["url"]
        assert url.startswith("data:image/png;base64,") and base64.b64decode(url.split(",", 1)[1]) == PNG
    # the format enters the episode keys: compact and compact+screenshot never share a cached rollout
    assert shot.key != plain.key


def test_the_chat_messages_show_the_observation_of_the_format():
    """A served chat model reads the page as the stored prompt shows it: the compact page for ``compact``."""
    msgs = build_chat_messages("Buy a lamp", [R0], PAGE, compat=PromptFormat(observation="compact"))
    assert msgs[-1]["content"] == "Round 1\n\n" + compact_page(PAGE)
    assert build_chat_messages("Buy a lamp", [R0], PAGE, compat=PromptFormat()) == \
        build_chat_messages("Buy a lamp", [R0], PAGE)
    assert "[3] Forums" in msgs[-1]["content"] and "<a" not in msgs[-1]["content"]


@pytest.mark.parametrize("compat", ["webrl", "official", "webrl_restated"])
def test_the_screenshot_alone_keeps_the_intent_and_history_but_no_page(compat):
    fmt = PromptFormat(compat=compat, observation="screenshot")
    assert fmt.screenshot and fmt.text_observation is None and fmt.page(PAGE) == ""
    prompt = build_prompt("Buy a lamp", [R0, R1], PAGE, compat=fmt)
    assert prompt == build_prompt("Buy a lamp", [R0, R1], "", compat=compat)
    assert "Buy a lamp" in prompt and R0 in prompt and R1 in prompt
    msgs = build_chat_messages("Buy a lamp", [R0], PAGE, compat=fmt, screenshot=PNG)
    text = msgs[-1]["content"][0]["text"]
    assert [m["content"] for m in msgs[:-1]] == [m["content"] for m in build_chat_messages("Buy a lamp", [R0], "",
                                                                                             compat=compat)[:-1]]
    for shown in ("Forums", "Posts", "Lamp 24", "Search", "<a ", "<html"):
        assert shown not in text and shown not in prompt.rsplit("Round", 1)[-1]
    # the ORM is a text model: with no page text in the observation it reads the HTML of the end state
    assert build_orm_prompt("Buy a lamp", [R0], PAGE, compat=fmt) == \
        build_orm_prompt("Buy a lamp", [R0], PAGE, compat=PromptFormat(compat=compat, observation="html"))
    both = PromptFormat(compat=compat, observation="html+screenshot")
    assert len({fmt.key, PromptFormat(compat=compat).key, both.key}) == 3


@pytest.mark.parametrize("observation", ["compact+screenshot", "html+screenshot", "compact_id_after+screenshot",
                                         "screenshot"])
def test_only_a_chat_endpoint_takes_a_screenshot(observation):
    hf = rf"prompt.observation='{re.escape(observation)}'.*policy.backend='hf'.*without image input"
    with pytest.raises(ValueError, match=hf):
        check_screenshot_input(observation, "hf", "chat")
    with pytest.raises(ValueError, match=r"policy.backend='openai' with prompt.style='completion'.*/completions"):
        check_screenshot_input(observation, "openai", "completion")
    for backend, style in (("openai", "chat"), ("oracle", "completion"), ("random", "chat")):
        check_screenshot_input(observation, backend, style)
    check_screenshot_input(observation.removesuffix("+screenshot") if "+" in observation else "html", "hf",
                           "completion")


def test_an_unknown_observation_is_refused():
    with pytest.raises(ValueError, match=r"prompt.observation 'screenshot\+compact' is unknown.*'compact\+screenshot'"):
        PromptFormat(observation="screenshot+compact")


# --- unknown formats ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("call", [
    lambda: build_prompt("T", [], "h", compat="Official"),
    lambda: round0_prompt("T", "h", compat="Official"),
    lambda: build_chat_messages("T", [], "h", compat="Official"),
    lambda: build_orm_prompt("T", ["a"], "h", compat="Official"),
    lambda: orm_prompt_for_episode({"intent": "T"}, [{"idx": 0, "response": "a", "html": ""}], compat="Official"),
    lambda: orm_examples_from_episodes([], {}, {}, compat="Official"),
    lambda: import_vab_traces("/nonexistent", compat="Official"),
])
def test_unknown_compat_is_refused(call):
    with pytest.raises(ValueError, match=r"'Official'.*allowed: 'webrl', 'official'"):
        call()


def test_rollout_refuses_unknown_compat_before_starting():
    from webrl_core.env.rollout import rollout
    with pytest.raises(ValueError, match=r"'chat'.*allowed: 'webrl', 'official'"):
        asyncio.run(rollout([], None, 1, cfg=None, prompt_compat="chat"))


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.mark.parametrize("observation", ["compact_id_after", "html"])
@pytest.mark.parametrize("past", [[], [R0, R1]])
@pytest.mark.parametrize("cut", [False, True])
def test_a_served_chat_model_reads_the_framed_prompt(observation, past, cut):
    """With the model's own template (the demo's ``prompt.style: chat``), the chat messages a served policy sends,
    rendered by the server through that template, are the prompt the in-process policy reads and the store keeps;
    the cut page included. (They were the unframed layout's turns: a served SFT actor solved 0 of 60 where the
    in-process one solved 5.)"""
    from webrl_core.agent.policy import OpenAIPolicy
    from webrl_core.agent_api import StepContext
    from webrl_core.prompts import render_chat

    fmt = PromptFormat(style="chat", observation=observation, chat_template=CHATML)
    whole = build_prompt("Buy a lamp", past, PAGE, compat=fmt)
    budget = len(whole) - 5 if cut else prompts.DEFAULT_BUDGET
    msgs = build_chat_messages("Buy a lamp", past, PAGE, budget, compat=fmt)
    prompt = build_prompt("Buy a lamp", past, PAGE, budget, compat=fmt)
    assert render_chat(fmt, msgs) == prompt
    assert msgs[0]["content"] == prompts.SMALL_CHAT_SYSTEM and msgs[-1]["content"].endswith("\n\nTask: Buy a lamp")
    if cut:  # the page gave way, the task did not
        assert len(prompt) <= budget and prompt != whole and prompt.endswith("Task: Buy a lamp<|im_end|>\n"
                                                                             "<|im_start|>assistant\n")
    policy = OpenAIPolicy("http://127.0.0.1:1/v1", "actor", style="chat", compat=fmt, obs_budget=budget)
    ctx = StepContext(task={"intent": "Buy a lamp"}, html=PAGE, url="http://site/", step=len(past),
                      past_responses=past)
    path, body = policy._request(prompt, ctx)  # the rollout's env.obs_char_budget, not the default
    assert path == "/chat/completions" and body["messages"] == msgs
