"""PAE's autonomous evaluator as the phase's reward (``reward.source: judge``): the endpoint judge against a scripted
OpenAI-compatible endpoint on 127.0.0.1 (what it receives: the evidence and the episode's last screenshots as PNG
images), the verdict reading, the local judge (SmolLM2-135M-Instruct zero-shot), and the ``judge_label`` stage on a
store of real embedded-site episodes."""

from __future__ import annotations

import base64
import math
import struct
from pathlib import Path
from types import SimpleNamespace

import pytest

from chat_endpoint import ChatHandler, serve
from webrl_core.config_loader import load_config
from webrl_core.learn import outcome_judge as oj
from webrl_core.pretrained import resolve_model_ref
from webrl_core.runs.store import TrajectoryStore

VIEWPORT = (480, 360)  # small pages: quick screenshots, and a size no default has


def _rule(text: str) -> str:
    """The scripted judge: "revenue" tasks succeed; the downvote with a single action gets a reply without a
    verdict; anything else fails ("NOT SUCCESS", which contains "SUCCESS")."""
    if "revenue" in text:
        return "The answer matches the report on the page.\nSUCCESS"
    if "Downvote" in text and "\n2. " not in text:
        return "I cannot tell from this."
    return "The page does not show the change.\nNOT SUCCESS"


class ScriptedJudge(ChatHandler):
    """Answers by ``rule`` (class attribute: text of the user turn -> reply); records every request; ``fail``
    answers 500."""

    rule = staticmethod(_rule)
    fail = False

    def answer(self, body):
        if type(self).fail:
            return 500, None
        user = body["messages"][-1]["content"]
        text = user if isinstance(user, str) else "".join(p["text"] for p in user if p["type"] == "text")
        return type(self).rule(text)


@pytest.fixture(scope="module")
def judge_url():
    with serve(ScriptedJudge) as url:
        yield url


@pytest.fixture
def scripted(judge_url):
    ScriptedJudge.requests.clear()
    ScriptedJudge.rule = staticmethod(_rule)
    ScriptedJudge.fail = False
    return judge_url


def _settings(*sets):
    return load_config("smoke", sets=["env.n_envs=1", "env.screenshots=true", f"env.viewport_width={VIEWPORT[0]}",
                                      f"env.viewport_height={VIEWPORT[1]}", *sets])


@pytest.fixture(scope="module")
def rolled(tmp_path_factory):
    """A run dir with 4 episodes on the embedded sites, screenshots on: 2 tasks (a reddit downvote, a revenue
    question) by the oracle and by the oracle that quits early (its downvote fails)."""
    from webrl_core.pipeline import task_sets
    from webrl_core.pipeline.experience import merge_rollouts, rollout

    run_dir = tmp_path_factory.mktemp("judge_run")
    s = _settings()
    tasks = task_sets.train_task_pool(s, str(run_dir), 2, 1, "pool")
    got = merge_rollouts([rollout(s, str(run_dir), 1, purpose, tasks, None, 0.0)
                          for purpose in ("oracle", "early-exit")])
    assert got["errors"] == 0 and got["n"] == 4
    return run_dir, got


def _stored(run_dir):
    store = TrajectoryStore(run_dir)
    eps = sorted(store.episodes(), key=lambda e: e["episode_id"])
    _, by_ep = store.finished_episodes([e["episode_id"] for e in eps])
    return eps, {k: sorted(v, key=lambda s: s["idx"]) for k, v in by_ep.items()}


def _png_size(data: bytes) -> tuple[int, int]:
    return struct.unpack(">II", data[16:24])  # IHDR: width, height


# ---------------------------------------------------------------------------------------------
# the verdict

@pytest.mark.parametrize("reply,verdict", [
    ("The cart shows the item.\nSUCCESS", True),
    ("NOT SUCCESS", False),                       # contains "SUCCESS": still a failure
    ("Nothing changed on the page.\nNOT\nSUCCESS", False),
    ("The agent reported success but the page shows nothing.\nNOT SUCCESS", False),
    ("The task was completed successfully.", None),  # no verdict: prose is not one
    ("", None),
])
def test_the_verdict_is_pae_s_reading_and_a_reply_without_one_is_none(reply, verdict):
    assert oj.parse_verdict(reply) is verdict


# ---------------------------------------------------------------------------------------------
# the endpoint judge

def test_the_endpoint_judge_receives_the_evidence_and_the_last_screenshots_as_png_images(rolled, scripted,
                                                                                        monkeypatch):
    run_dir, _ = rolled
    monkeypatch.setenv("WEBRL_TEST_OJ_KEY", "sk-test")
    eps, steps = _stored(run_dir)
    cases = [oj.judge_case(e, steps[e["episode_id"]], max_page_chars=3000,
                           screenshot_dir=Path(run_dir) / "screenshots" / e["episode_id"], n_screenshots=2)
             for e in eps]
    judge = oj.EndpointJudge(scripted, model="judge-vlm", api_key_env="WEBRL_TEST_OJ_KEY", retries=0)
    verdicts = judge.judge(cases)
    assert len(ScriptedJudge.requests) == len(eps) == 4
    sent = {}  # the user turn's text -> its image parts
    for req in ScriptedJudge.requests:
        assert req["path"] == "/v1/chat/completions" and req["auth"] == "Bearer sk-test"
        body = req["body"]
        assert body["model"] == "judge-vlm" and body["temperature"] == 0
        system, user = body["messages"]
        assert system["role"] == "system" and "SUCCESS" in system["content"] and "NOT SUCCESS" in system["content"]
        assert user["content"][0]["type"] == "text"
        sent[user["content"][0]["text"]] = user["content"][1:]
    for e, case, v in zip(eps, cases, verdicts):
        st = steps[e["episode_id"]]
        text = oj.judge_user_text(case)  # which request is this episode's (the checks below read what was sent)
        assert text in sent and f"Task: {e['intent']}" in text
        # the actions, one line each, in order
        lines = [ln for s in st for ln in s["response"].strip().splitlines() if ln.strip()]
        at = text.index("Actions taken:")
        for ln in lines:  # each found after the previous one
            at = text.index(ln, at) + len(ln)
        # the last page the agent saw, as text (the last step's observation)
        assert st[-1]["html"][:300] in text
        assert f"Final answer: {e['final_answer']}" in text  # every episode here ended by exit(message=...)
        # the images: PNGs of the page (the viewport's size), the episode's last two screenshots in order
        folder = Path(run_dir) / "screenshots" / e["episode_id"]
        expected = [folder / f"{i}.png" for i in range(e["n_steps"])]
        expected += [folder / "final.png"] if (folder / "final.png").is_file() else []
        images = sent[text]
        assert len(images) == len(expected[-2:]) >= 1 and all(p["type"] == "image_url" for p in images)
        for part, path in zip(images, expected[-2:]):
            head, data = part["image_url"]["url"].split(",", 1)
            assert head == "data:image/png;base64"
            png = base64.b64decode(data)
            assert png[:8] == b"\x89PNG\r\n\x1a\n" and _png_size(png) == VIEWPORT
            assert png == path.read_bytes()
        # the verdict follows the reply
        assert v.p_success == {"SUCCESS": 1.0, "NOT SUCCESS": 0.0, None: None}[
            next((w for w in ("NOT SUCCESS", "SUCCESS") if w in _rule(text)), None)]


def test_the_endpoint_judge_sends_text_alone_without_screenshots_and_no_key_means_no_auth(rolled, scripted):
    run_dir, _ = rolled
    eps, steps = _stored(run_dir)
    case = oj.judge_case(eps[0], steps[eps[0]["episode_id"]], max_page_chars=100)
    assert len(case.page) <= 100 + len(oj.PAGE_CUT_NOTE)
    ScriptedJudge.rule = staticmethod(lambda text: "Looks done. SUCCESS")
    [v] = oj.EndpointJudge(scripted, model="m", api_key_env="WEBRL_TEST_OJ_UNSET_KEY", retries=0).judge([case])
    assert v.p_success == 1.0 and v.success is True and v.note.endswith("SUCCESS")
    req = ScriptedJudge.requests[-1]
    assert req["auth"] is None and isinstance(req["body"]["messages"][1]["content"], str)


def test_an_endpoint_that_fails_or_never_gives_a_verdict_is_an_error_naming_reward_judge(rolled, scripted):
    run_dir, _ = rolled
    eps, steps = _stored(run_dir)
    cases = [oj.judge_case(e, steps[e["episode_id"]], max_page_chars=200) for e in eps[:2]]
    judge = oj.EndpointJudge(scripted, model="m", api_key_env="", retries=0)
    ScriptedJudge.rule = staticmethod(lambda text: "I am not sure.")
    with pytest.raises(oj.OutcomeJudgeError, match=r"reward\.judge.*no SUCCESS / NOT SUCCESS verdict on any of 2"):
        judge.judge(cases)
    ScriptedJudge.fail = True
    with pytest.raises(oj.OutcomeJudgeError, match=r"outcome judge http://127\.0\.0\.1:\d+/v1 \(model m, "
                                                  r"reward\.judge\) failed on episode"):
        judge.judge(cases)


def test_screenshots_asked_for_but_absent_fail_naming_the_settings(rolled, tmp_path):
    run_dir, _ = rolled
    eps, steps = _stored(run_dir)
    with pytest.raises(FileNotFoundError, match=r"reward\.judge_screenshots=3.*env\.screenshots"):
        oj.judge_case(eps[0], steps[eps[0]["episode_id"]], max_page_chars=200, screenshot_dir=tmp_path,
                      n_screenshots=3)


def test_the_factory_reads_reward_judge():
    s = load_config("smoke", sets=["reward.source=judge", "reward.judge=http://127.0.0.1:9/v1/",
                                   "reward.judge_model=qwen-vl", "reward.judge_api_key_env=MY_KEY"])
    j = oj.outcome_judge_from_settings(s)
    assert isinstance(j, oj.EndpointJudge) and (j.base_url, j.model, j.api_key_env) == (
        "http://127.0.0.1:9/v1", "qwen-vl", "MY_KEY")
    with pytest.raises(ValueError, match=r"reward\.source: judge needs reward\.judge"):
        oj.outcome_judge_from_settings(SimpleNamespace(reward=s.reward.model_copy(update={"judge": None})))
    with pytest.raises(ValueError, match=r"reward\.judge_screenshots=2 needs an endpoint judge"):
        oj.outcome_judge_from_settings(SimpleNamespace(reward=s.reward.model_copy(
            update={"judge": "smollm2-135m-instruct", "judge_screenshots": 2})))
    with pytest.raises(FileNotFoundError, match=r"reward\.judge '/nonexistent/judge'"):
        oj.outcome_judge_from_settings(load_config("smoke", sets=["reward.judge=/nonexistent/judge"]))


# ---------------------------------------------------------------------------------------------
# the local judge

@pytest.fixture(scope="module")
def smollm():
    folder = Path(resolve_model_ref("smollm2-135m-instruct"))
    if not (folder / "config.json").is_file():
        pytest.skip(f"SmolLM2-135M-Instruct is not set up ({folder}): webrl models setup smollm2-135m-instruct")
    s = load_config("smoke", sets=["reward.source=judge", "reward.judge=smollm2-135m-instruct",
                                   "models.max_length=1024", "models.device=cpu", "models.dtype=float32"])
    return oj.outcome_judge_from_settings(s)


def _local_cases():
    """Three short episodes of different lengths (left padding in a batch), one with no answer."""
    return [
        oj.JudgeCase("a", "What is the price of the blue kettle?", ('do(action="Click", element="4")',),
                     "Blue kettle [4] $24.99 Add to cart [5]", "$24.99"),
        oj.JudgeCase("b", "Downvote the post 'Is this seedlings worth it?' in f/gardening.",
                     ('do(action="Click", element="2")', 'do(action="Click", element="7")', 'exit(message="Done")'),
                     "f/gardening Is this seedlings worth it? [7] downvote score -1", "Done"),
        oj.JudgeCase("c", "Add the red mug to the cart.", ('do(action="Scroll Down")',),
                     "Red mug [3] Add to cart [4] Cart (0)", None),
    ]


def test_the_local_judge_gives_p_yes_after_the_chat_template_batched_as_unbatched(smollm):
    import torch

    cases = _local_cases()
    assert isinstance(smollm, oj.LocalJudge) and smollm.name == "smollm2-135m-instruct"
    batched = smollm.p_success(cases, batch_size=3)
    assert all(0.0 <= p <= 1.0 for p in batched) and len(set(round(p, 6) for p in batched)) == 3
    # one at a time (no padding) the same; the third by hand: the chat template's prompt, then the answers'
    # log-probabilities from one forward over prompt + "YES" (whose tokens start after the prompt; "NO" is one token)
    assert batched[:2] == pytest.approx([smollm.p_success([c], batch_size=1)[0] for c in cases[:2]], abs=1e-4)
    tok, model = smollm.tok, smollm.scorer.model
    prompt = smollm.prompt(cases[2])
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
    assert "Reply with one word: YES" in prompt and "Task: Add the red mug to the cart." in prompt
    assert "Final answer: (none)" in prompt
    ids = tok.encode(prompt, add_special_tokens=False)
    yes, [no] = tok.encode("YES", add_special_tokens=False), tok.encode("NO", add_special_tokens=False)
    with torch.no_grad():
        logp = model(input_ids=torch.tensor([ids + yes])).logits[0].float().log_softmax(-1)
    lp_yes = sum(logp[len(ids) - 1 + k, a].item() for k, a in enumerate(yes))
    lp_no = logp[len(ids) - 1, no].item()
    assert batched[2] == pytest.approx(1 / (1 + math.exp(lp_no - lp_yes)), abs=1e-4)


def test_the_local_judge_cuts_the_page_never_the_question_to_fit_max_length(smollm):
    case = oj.JudgeCase("e", "Find the price of the blue kettle.", ("do(action=\"Click\", element=\"3\")",),
                        "kettle " * 3000, None)
    room = smollm.models_cfg.max_length
    prompt = smollm.prompt(case)
    from webrl_core.learn.models import prompt_token_ids

    assert len(prompt_token_ids(smollm.tok, prompt)) <= room
    assert prompt.endswith("<|im_start|>assistant\n") and "Final answer: (none)" in prompt
    assert 0 < prompt.count("kettle") < 3000


# ---------------------------------------------------------------------------------------------
# the labelling stage

def test_judge_label_writes_the_judge_s_labels_scores_and_its_agreement_with_the_evaluators(rolled, scripted):
    from webrl_core.pipeline.experience import judge_label

    run_dir, got = rolled
    eps, _ = _stored(run_dir)
    truth = {e["episode_id"]: e["env_score"] == 1.0 for e in eps}
    kind = {e["episode_id"]: ("revenue" if "revenue" in e["intent"] else "downvote") + f"/{e['n_steps']}" for e in eps}
    # the scripted judge: revenue -> SUCCESS, the one-action downvote -> no verdict, the oracle's downvote -> NOT
    judge = {i: (True if k.startswith("revenue") else None if k == "downvote/1" else False) for i, k in kind.items()}
    assert sorted(truth.values()) == [False, True, True, True] and list(judge.values()).count(None) == 1
    s = _settings("reward.source=judge", f"reward.judge={scripted}", "reward.judge_model=judge-vlm",
                  "reward.judge_screenshots=2")
    out = judge_label(s, str(run_dir), 1, got)
    rows = {r["episode_id"]: r for r in TrajectoryStore(run_dir).episodes()}
    assert {i: rows[i]["success"] for i in truth} == judge
    scores = {r["episode_id"]: r for r in TrajectoryStore(run_dir).sql(
        "SELECT * FROM scores WHERE kind = 'judge_p_success'")}
    assert {i: scores[i]["value"] for i in truth} == {i: (None if v is None else float(v)) for i, v in judge.items()}
    assert {r["model_id"] for r in scores.values()} == {"judge-vlm"}
    user_turns = [req["body"]["messages"][1]["content"] for req in ScriptedJudge.requests]
    assert len(user_turns) == 4 and all([p["type"] for p in u][1:] == ["image_url"] * (len(u) - 1) and len(u) >= 2
                                        for u in user_turns)
    both = [(judge[i], truth[i]) for i in truth if judge[i] is not None]
    tp = sum(a and b for a, b in both)
    assert out == {"episodes": 4, "reward_source": "judge", "unscored": 0, "env_successes": 3, "judge_yes": 2,
                   "judge_unparsed": 1, "labelled_success_rate": 2 / 3, "judge_success_rate": 2 / 3,
                   "env_success_rate": 0.75, "judge_accuracy": sum(a == b for a, b in both) / len(both),
                   "judge_precision": tp / sum(a for a, _ in both), "judge_recall": tp / sum(b for _, b in both)}
    assert (out["judge_accuracy"], out["judge_precision"], out["judge_recall"]) == pytest.approx((2 / 3, 1.0, 2 / 3))


def test_judge_label_with_env_labels_keeps_the_evaluators_and_refuses_what_it_cannot_do(rolled, scripted):
    from webrl_core.pipeline.experience import judge_label

    run_dir, got = rolled
    out = judge_label(_settings("reward.source=env", f"reward.judge={scripted}"), str(run_dir), 1, got)
    rows = TrajectoryStore(run_dir).episodes()
    assert {r["episode_id"]: r["success"] for r in rows} == {r["episode_id"]: r["env_score"] == 1.0 for r in rows}
    assert out["reward_source"] == "env" and out["labelled_success_rate"] == 0.75 and out["judge_yes"] == 2
    assert all(isinstance(r["body"]["messages"][1]["content"], str) for r in ScriptedJudge.requests)  # no images
    with pytest.raises(ValueError, match=r"reward\.source: orm is orm_label's"):
        judge_label(_settings("reward.source=orm", f"reward.judge={scripted}"), str(run_dir), 1, got)
