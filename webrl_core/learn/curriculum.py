"""Self-evolving curriculum: in-breadth task generation from failures, critic filtering, de-duplication.

Generation (WebRL paper, arXiv 2411.02337, Sec. 3.1): per site, ``generation_turns`` times, sample up to
``seed_num`` failed instructions of the previous phase and ask a generator for new tasks "in breadth": same domain
and difficulty, more diverse, reusing the variable values of the examples. Generators:

- ``EmbeddedGenerator``: for the embedded sites, varies each failed task within its site family
  (``webrl_core.sites.vary_task``), so new tasks come with verifiable evaluators; with ``breadth`` > 0 that share
  of the children are tasks of another family of the parent's site (``webrl_core.sites.tasks.widen_task``), the
  paper's "more diverse, same domain" that a within-family variation cannot give (ours, off by default);
- ``ChatGenerator``: an OpenAI-compatible chat endpoint (the official setup used GPT-4o); every
  backtick-enclosed span of the reply is a new task, wrapped in a config with a dummy evaluator;
- ``HFGenerator``: the same prompt through a local Hugging Face causal LM.

Filter (same section): keep a task iff  low <= V(Round-0 prompt on its start page) <= high  with the critic's
V = min of the two heads ([0.05, 0.75] by default; the official filter ORs the heads, we record both).
Phase 1 has no trained critic: ``phase1_filter: skip`` keeps all, ``orm`` uses the ORM's P(YES) of the
empty trajectory instead; the choice is recorded in the phase summary.

If fewer than ``min_kept_fraction * tasks_per_phase`` pass, the dropped tasks nearest the window top the set
up (``min_kept_fraction: 0`` is the official behaviour); ``min_kept_per_site`` (off by default, ours) keeps every
site's nearest few so no site leaves the curriculum for good.

De-duplication: a new task is dropped when its normalised intent (lowercase, collapsed whitespace, no
trailing punctuation) equals that of any earlier task of the run or of another new task.
"""

from __future__ import annotations

import random
import re
import statistics
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterable, Protocol

from webrl_core.env.webarena import make_generated_task_config

SITE_LABELS = {"shopping": "an online shop (OneStopMarket)", "shopping_admin": "the admin panel of an online shop",
               "reddit": "a forum (Postmill, like Reddit)", "gitlab": "a code hosting site (like GitLab)",
               "map": "a map and directions site (like OpenStreetMap)"}

GENERATION_PROMPT = """You create tasks for an assistant that operates the website {site_label} through a browser.
The tasks should be practical things a person might want to do on that website.

Take inspiration from the tasks under #Given Task#. Write new tasks in the same domain and of similar difficulty,
but more varied. They must be realistic and easy to understand. Do not write the markers "#Given Task#" or
"#Created Task#" in your answer.

Guidelines:
- put each new task inside backticks, like `task`;
- vary the wording between tasks;
- reuse the concrete values in the given tasks (names of products, places, users, projects) instead of inventing new ones;
- keep the difficulty reasonable.

#Given Task#
{examples}

#Created Task#
"""


def normalise_intent(text: str) -> str:
    return re.sub(r"\s+", " ", text.strip().lower()).rstrip(" .?!")


def dedupe(candidates: Iterable[dict], seen_intents: Iterable[str]) -> list[dict]:
    seen = {normalise_intent(s) for s in seen_intents}
    out = []
    for c in candidates:
        key = normalise_intent(c["intent"])
        if key in seen:
            continue
        seen.add(key)
        out.append(c)
    return out


def backtick_tasks(reply: str) -> list[str]:
    """Every backtick-enclosed span of a generator reply (official parsing rule)."""
    return [t.strip() for t in re.findall(r"`([^`\n]{8,400})`", reply) if t.strip()]


class Generator(Protocol):
    name: str

    def generate(self, failed_by_site: dict[str, list[dict]], rng: random.Random, n_per_site: int) -> list[dict]: ...


@dataclass
class EmbeddedGenerator:
    """Vary failed embedded tasks within their families (verifiable evaluators come along); a ``breadth`` share of
    the children are tasks of another family of the parent's site instead (``widen``)."""

    vary: Callable[[dict, random.Random], dict]
    name: str = "embedded"
    widen: Callable[[dict, random.Random], dict] | None = None
    breadth: float = 0.0

    def __post_init__(self):
        if self.breadth > 0 and self.widen is None:
            raise ValueError(f"EmbeddedGenerator: breadth={self.breadth} needs a widen function")

    def generate(self, failed_by_site: dict[str, list[dict]], rng: random.Random, n_per_site: int) -> list[dict]:
        out = []
        for site in sorted(failed_by_site):
            seeds = failed_by_site[site]
            if not seeds:
                continue
            for i in range(n_per_site):
                parent = seeds[i % len(seeds)] if i < len(seeds) else rng.choice(seeds)
                # breadth 0 draws nothing extra from rng: a run without it generates exactly what it did before
                wide = self.breadth > 0 and rng.random() < self.breadth
                child = (self.widen if wide else self.vary)(parent["config"], rng)
                child["parent_task_id"] = parent["task_id"]
                out.append(child)
        return out


@dataclass
class ChatGenerator:
    """In-breadth evolving through an OpenAI-compatible chat endpoint (official: gpt-4o, temperature 1)."""

    base_url: str
    model_name: str
    api_key: str | None = None
    turns: int = 2
    seed_num: int = 10
    name: str = "openai"
    timeout_s: float = 120.0
    retries: int = 0  # tries after a failed one (timeouts, connection errors, 429, 5xx; the SDK's max_retries)

    def complete(self, prompt: str) -> str:
        import openai  # here: a second of import that only a served generator needs

        url = self.base_url.rstrip("/")
        try:
            # no api_key: no Authorization header (the SDK insists on a key, so it gets one it never sends)
            no_auth = {} if self.api_key else {"extra_headers": {"Authorization": openai.Omit()}}
            with openai.OpenAI(base_url=url, api_key=self.api_key or "unused", timeout=self.timeout_s,
                               max_retries=self.retries) as client:
                reply = client.chat.completions.create(model=self.model_name, temperature=1.0, top_p=1.0,
                                                       messages=[{"role": "user", "content": prompt}], **no_auth)
            return reply.choices[0].message.content
        except (openai.APIError, ValueError, AttributeError, IndexError, TypeError) as e:
            raise RuntimeError(f"curriculum generator {url}/chat/completions (model {self.model_name!r}) failed: "
                               f"{type(e).__name__}: {e}") from None

    def generate(self, failed_by_site: dict[str, list[dict]], rng: random.Random, n_per_site: int) -> list[dict]:
        out = []
        for site in sorted(failed_by_site):
            seeds = failed_by_site[site]
            made: list[str] = []
            for _ in range(self.turns):
                shown = rng.sample(seeds, min(self.seed_num, len(seeds)))
                examples = "\n".join(f"- `{s['intent']}`" for s in shown)
                reply = self.complete(GENERATION_PROMPT.format(site_label=SITE_LABELS.get(site, site), examples=examples))
                made += backtick_tasks(reply)
            parent = seeds[0]
            for intent in made[:n_per_site]:
                # generated tasks start on the site's home page with a dummy evaluator (the ORM labels them)
                cfg = make_generated_task_config(task_id="", site=site, intent=intent)
                cfg["parent_task_id"] = parent["task_id"]
                out.append(cfg)
        return out


@dataclass
class HFGenerator(ChatGenerator):
    """The same prompt through a local HF causal LM (sampling, temperature 1)."""

    model_dir: str = ""
    name: str = "hf"
    max_new_tokens: int = 512

    def complete(self, prompt: str) -> str:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from webrl_core.learn.models import from_pretrained

        if not hasattr(self, "_model"):
            self._tok = AutoTokenizer.from_pretrained(self.model_dir)
            self._model = from_pretrained(AutoModelForCausalLM, self.model_dir)
        tok, model = self._tok, self._model
        if getattr(tok, "chat_template", None):
            ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                          return_tensors="pt")
        else:
            ids = tok(prompt, return_tensors="pt").input_ids
        out = model.generate(ids, do_sample=True, temperature=1.0, max_new_tokens=self.max_new_tokens)
        return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def filter_by_value(tasks: list[dict], values: list[tuple[float, float, float]], low: float, high: float
                    ) -> tuple[list[dict], list[dict]]:
    """Split tasks into (kept, dropped) by V = min(p1, p2) in [low, high]; annotate each with its values."""
    kept, dropped = [], []
    for t, (v, p1, p2) in zip(tasks, values):
        t = dict(t, critic_value=float(v), critic_p1=float(p1), critic_p2=float(p2))
        (kept if low <= v <= high else dropped).append(t)
    return kept, dropped


def _window_distance(task: dict, low: float, high: float) -> float:
    """How far a task's critic value lies outside [low, high] (0 inside): the top-ups take the nearest first."""
    return max(low - task["critic_value"], task["critic_value"] - high, 0.0)


def _first_site(task: dict) -> str:
    return (task.get("sites") or ["?"])[0]


def top_up_sites(kept: list[dict], dropped: list[dict], n_per_site: int, low: float, high: float) -> list[dict]:
    """Add, for every (first) site among ``kept + dropped`` with fewer than ``n_per_site`` kept tasks, its dropped
    tasks nearest [low, high] until it has ``n_per_site`` (marked ``filter_top_up``). Not in the paper or the official
    code: once a site's every candidate falls outside the window it gets no rollouts, hence no failures to evolve
    from, and leaves the curriculum for good (seed 1 of ``demo-full``: reddit after phase 1)."""
    if n_per_site <= 0:
        return kept
    have = Counter(map(_first_site, kept))
    ids = {t["task_id"] for t in kept}
    added = []
    for t in sorted(dropped, key=lambda t: _window_distance(t, low, high)):
        if t["task_id"] not in ids and have[_first_site(t)] < n_per_site:
            have[_first_site(t)] += 1
            added.append(dict(t, filter_top_up=True))
    return kept + added


def value_by_site(tasks: Iterable[dict]) -> dict[str, dict[str, float]]:
    """Per (first) site of ``tasks`` annotated by ``filter_by_value``: how many, and the median, lowest and highest
    critic value V, so a phase's report says where the filter's window cut each site (a site whose every candidate
    lies outside [low, high] drops out of the curriculum)."""
    by: dict[str, list[float]] = {}
    for t in tasks:
        by.setdefault(_first_site(t), []).append(float(t["critic_value"]))
    return {site: {"n": len(vs), "median": statistics.median(vs), "min": min(vs), "max": max(vs)}
            for site, vs in sorted(by.items())}


def top_up(kept: list[dict], dropped: list[dict], n_min: int, low: float, high: float) -> list[dict]:
    """Add the dropped tasks whose value is nearest [low, high] until ``n_min`` are kept (marked ``filter_top_up``),
    site by site: the nearest dropped task of every site first, then the second nearest of each, and so on.

    A young critic can put every candidate outside the window; an empty phase wastes the whole phase. A saturated
    one (every value about 1) orders the candidates by rounding noise, and without the turns one site fills the
    top-up (a `demo-full` phase 2 whose critic trained on the whole buffer: 15 map tasks out of 101 candidates from
    five sites; docs/notebook/curriculum.md).
    """
    need = n_min - len(kept)
    if need <= 0:
        return kept
    turn: dict[tuple, int] = {}
    ranked = []
    for i, t in enumerate(sorted(dropped, key=lambda t: _window_distance(t, low, high))):
        site = tuple(t.get("sites") or ())
        turn[site] = turn.get(site, -1) + 1
        ranked.append((turn[site], i, t))
    return kept + [dict(t, filter_top_up=True) for _, _, t in sorted(ranked, key=lambda r: r[:2])[:need]]
