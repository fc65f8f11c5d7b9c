"""The self-evolving curriculum of a phase (paper Sec. 3.1): new instructions generated "in breadth" from the
tasks the agent failed in phase k-1, then filtered by the critic: keep a task when the critic's value of its
start page (the Round-0 prompt) lies in [``curriculum.filter_low``, ``filter_high``] (0.05 and 0.75 in the paper),
so tasks are neither hopeless nor already solved. In phase 1 there is no trained critic yet: the filter is skipped,
or uses the ORM's P(YES) on the start page (``curriculum.phase1_filter: orm``).

Two other recipes' task sources take the generation's place (``curriculum.generator``): PAE's context-aware
proposer (``propose``: tasks written from each site's own pages, ``webrl_core.learn.proposer``) and WebAgent-R1's
training pool (``train_pool``: a fresh draw of training tasks each phase); neither needs failures."""

from __future__ import annotations

import asyncio
import json
import math
import os
import random

from webrl_core import identity
from webrl_core.artifacts import ArtifactRef, read_json
from webrl_core.learn.critic import Critic
from webrl_core.learn.curriculum import (ChatGenerator, EmbeddedGenerator, HFGenerator, dedupe, filter_by_value, top_up,
                                         top_up_sites, value_by_site)
from webrl_core.learn.proposer import (EmbeddedProposer, LLMProposer, example_tasks, hooks_sites, proposal_stats,
                                       read_sites, split_tasks)
from webrl_core.env.browser import BrowserPool
from webrl_core.env.web_env import WebEnv
from webrl_core.learn.orm import OrmScorer
from webrl_core.pipeline.stage import stage
from webrl_core.pipeline.task_sets import count_sites
from webrl_core.prompts import build_orm_prompt, prompt_format, round0_prompt
from webrl_core.agent.rollout_policy import phase_policy_digest
from webrl_core.runs.rundir import labelled_state, output_key, phase_dir, write_json_version
from webrl_core.sites.session import site_session
from webrl_core.sites.tasks import test_set, train_tasks, vary_task, widen_task
from webrl_core.runs.store import TrajectoryStore
from webrl_core.websites import SITES

SEED_TASKS_SQL = """SELECT DISTINCT e.site, e.task_id, e.intent, t.config_json FROM episodes e
                    JOIN tasks t USING (task_id) WHERE e.phase = $p AND e.purpose = $pur AND e.policy_digest = $pd
                    {only_failed} ORDER BY e.site, e.task_id"""


class NoSeedTasks(RuntimeError):
    """A phase has nothing to evolve new tasks from: the previous phase has no labelled episodes."""


@stage("run", "curriculum", "policy", "serving", "sites")
def generate_tasks(settings, run_dir: str, phase: int, seed_purpose: str) -> tuple[ArtifactRef, dict]:
    """Phase ``phase``'s candidate tasks, as ``curriculum.generator`` says:

    - ``embedded`` / ``openai`` / ``hf``: in-breadth evolving from phase k-1's failed tasks (all its tasks when none
      failed), de-duplicated against every task of earlier phases; ``NoSeedTasks`` when phase k-1 has no labelled
      episodes;
    - ``propose``: PAE's context-aware proposer (``webrl_core.learn.proposer``), ``tasks_per_phase`` tasks over the
      run's sites, written from the sites' own pages (served here as the rollouts serve them), no failures needed;
    - ``train_pool``: WebAgent-R1's setting (arXiv 2505.16421, no curriculum): ``tasks_per_phase`` tasks of the
      embedded training pool, a fresh deterministic draw per (``run.seed``, phase).

    Proposed and drawn tasks are de-duplicated within the phase and against the test set only: PAE and WebAgent-R1
    come back to their task sets iteration after iteration. Every task gets its content-derived id."""
    store = TrajectoryStore(run_dir)
    generator = settings.curriculum.generator
    if generator == "train_pool":
        cands, stats, state = train_pool_tasks(settings, phase), {"seed_source": "training pool", "seeds": 0}, None
    elif generator == "propose":
        cands, stats = propose_tasks(settings, phase)
        state = None
    else:
        cands, stats, state = evolve_tasks(settings, store, run_dir, phase, seed_purpose)
    if state is None:  # never a test task; earlier phases' tasks may come again
        seen = [r["intent"] for r in store.sql("SELECT intent FROM tasks WHERE origin = 'test'")]
        seen += [t["intent"] for t in test_set(settings.sites.data_seed)]
    else:
        # de-duplicate against the tasks of earlier phases (train pools, test set, earlier generations), not against
        # this phase's own earlier output: a re-run must generate the same tasks again
        seen = [r["intent"] for r in store.sql("SELECT intent FROM tasks WHERE phase < $p", {"p": phase})]
    cands = dedupe(cands, seen)
    if generator == "train_pool":
        cands = cands[:settings.curriculum.tasks_per_phase]  # drawn with spares for what de-duplication drops
    for c in cands:
        c["task_id"] = identity.generated_task_id(phase, c)
    key = output_key(settings) if state is None else output_key(settings, state)
    ref = write_json_version(cands, phase_dir(run_dir, "tasks", phase) / "generated.json", key)
    return ref, {**stats, "generated": len(cands),
                 "generated_families": len({c["family"] for c in cands if "family" in c}),  # LLM tasks have none
                 **{f"generated_{k}": v for k, v in count_sites(cands).items()}}


def _llm(curriculum, hf: bool) -> ChatGenerator:
    """The curriculum's LLM: a local HF model (``hf_model``) or an OpenAI-compatible endpoint (``base_url``)."""
    if hf:
        return HFGenerator(curriculum.base_url or "", curriculum.model_name, None, curriculum.generation_turns,
                           curriculum.seed_num, model_dir=curriculum.hf_model or "")
    return ChatGenerator(curriculum.base_url, curriculum.model_name, os.environ.get(curriculum.api_key_env),
                         curriculum.generation_turns, curriculum.seed_num)


def evolve_tasks(settings, store: TrajectoryStore, run_dir: str, phase: int, seed_purpose: str
                 ) -> tuple[list[dict], dict, str]:
    """(candidates, stats, digest of the seeds' labels): the curriculum's generator on phase k-1's failed tasks
    (all its tasks when none failed)."""
    prev = phase - 1
    args = {"p": prev, "pur": seed_purpose, "pd": phase_policy_digest(settings, run_dir, prev)}
    seeds = store.sql(SEED_TASKS_SQL.format(only_failed="AND e.success = false"), args)
    seed_source = "failed tasks"
    if not seeds:  # nothing failed (or the ORM says so): evolve from all of the previous phase's tasks instead
        seed_source = "all tasks (no failures)"
        seeds = store.sql(SEED_TASKS_SQL.format(only_failed=""), args)
    if not seeds:
        raise NoSeedTasks(
            f"phase {phase}: phase {prev} has no labelled {seed_purpose!r} episodes by {args['pd']} to evolve new "
            f"tasks from. " + ("Phase 1 evolves from the bootstrap's rollouts of the SFT actor: with "
                               "bootstrap.sft_actor or bootstrap.sft_data set, give curriculum.seed_tasks (a "
                               "WebArena-Lite-format task file) for it to roll out." if phase == 1 else
                               f"Run phase {prev} first (webrl phase --phase {prev})."))
    by_site: dict[str, list[dict]] = {}
    for r in seeds:
        by_site.setdefault(r["site"], []).append({"task_id": r["task_id"], "intent": r["intent"],
                                                   "config": json.loads(r["config_json"])})
    curriculum = settings.curriculum
    if curriculum.generator == "embedded":
        gen = EmbeddedGenerator(vary_task, widen=widen_task, breadth=curriculum.breadth)
    else:
        gen = _llm(curriculum, hf=curriculum.generator == "hf")
    rng = random.Random(settings.run.seed * 7919 + phase)
    # over-generate so the filter can still keep tasks_per_phase
    n_per_site = max(1, (2 * curriculum.tasks_per_phase) // max(1, len(by_site))) if by_site else 0
    cands = gen.generate(by_site, rng, n_per_site)
    return cands, {"seed_source": seed_source, "seeds": len(seeds)}, labelled_state(run_dir, prev, args["pd"])


def propose_tasks(settings, phase: int) -> tuple[list[dict], dict]:
    """(candidates, stats): PAE's proposer over the sites of the run, served for the length of the call. An LLM
    proposer when ``curriculum.hf_model`` or ``base_url`` is set (it reads each start page), else the embedded one
    (the start page and the pages it links to; the embedded sites only: its tasks are their families')."""
    curriculum = settings.curriculum
    llm = bool(curriculum.hf_model or curriculum.base_url)
    if not llm and settings.sites.mode != "embedded":
        raise ValueError("curriculum.generator=propose without curriculum.base_url or curriculum.hf_model is the "
                         "embedded proposer, which writes tasks of the embedded sites' families: with sites.mode="
                         f"{settings.sites.mode} set curriculum.base_url (or hf_model) to an LLM proposer")
    rng = random.Random(settings.run.seed * 7919 + phase)
    with site_session(settings) as hooks:
        sites = hooks_sites(hooks, SITES)
        contexts = read_sites(hooks, sites, max_pages=1 if llm else 24)
    if llm:
        examples = example_tasks(sites, rng, settings.sites.data_seed) if settings.sites.mode == "embedded" else {}
        proposer = LLMProposer(_llm(curriculum, hf=bool(curriculum.hf_model)), examples)
    else:
        proposer = EmbeddedProposer(settings.sites.data_seed)
    cands = proposer.propose(contexts, split_tasks(curriculum.tasks_per_phase, sites, rng), rng)
    return cands, {"seed_source": f"site contexts ({proposer.name} proposer)", "seeds": 0,
                   **proposal_stats(cands, contexts)}


def train_pool_tasks(settings, phase: int) -> list[dict]:
    """WebAgent-R1's tasks of phase ``phase``: a draw from the embedded training families' pools (never a test
    instantiation), twice ``tasks_per_phase`` so that de-duplication leaves enough. The seed is the run's seed and
    the phase; the bootstrap's pools (``train_task_pool``) take offsets 1-3 of the same run seed, so a phase below
    900 draws its own tasks."""
    n = settings.curriculum.tasks_per_phase
    return train_tasks(2 * n, seed=settings.run.seed * 1000 + 100 + phase, data_seed=settings.sites.data_seed)


def start_page_html(settings, tasks: list[dict]) -> dict[str, str]:
    """Simplified HTML of each distinct start URL (the Round-0 observation the critic scores), via WebEnv.reset."""
    firsts: dict[str, dict] = {}
    for t in tasks:
        firsts.setdefault(t["start_url"], t)

    async def observe(hooks) -> dict[str, str]:
        out = {}
        async with BrowserPool(settings.env) as pool:
            env = WebEnv(pool, settings.env, hooks)
            for i, (url, task) in enumerate(sorted(firsts.items())):
                obs = await env.reset(task, f"start-page-{i}")
                out[url] = obs.html
            await env.close()
        return out

    with site_session(settings) as hooks:
        return asyncio.run(observe(hooks))


@stage("run", "sites", "env", "models", "critic", "curriculum", "orm", "prompt")
def filter_tasks(settings, run_dir: str, phase: int, candidates_ref: ArtifactRef, critic_ref: ArtifactRef | None,
                 trained_critic: bool, orm_ref: ArtifactRef | None) -> tuple[ArtifactRef, dict]:
    """Keep tasks whose value on the Round-0 start-page prompt lies in [filter_low, filter_high]; top up to
    ``min_kept_fraction`` of ``tasks_per_phase`` with the nearest dropped ones, site by site; at most
    ``tasks_per_phase``."""
    cands = read_json(candidates_ref)
    critic_settings, curriculum = settings.critic, settings.curriculum
    how = "critic"
    fmt = prompt_format(settings)
    if not cands:
        kept, dropped = [], []
    elif trained_critic and critic_ref is not None:
        pages = start_page_html(settings, cands)
        prompts = [round0_prompt(t["intent"], pages.get(t["start_url"], ""), settings.env.obs_char_budget,
                                 compat=fmt)
                   for t in cands]
        critic = Critic.load(critic_ref.path, settings.models.dtype, settings.models.device, settings.models.max_length)
        value, p_head1, p_head2 = critic.values(prompts)
        kept, dropped = filter_by_value(cands, list(zip(value.tolist(), p_head1.tolist(), p_head2.tolist())),
                                        curriculum.filter_low, curriculum.filter_high)
    elif curriculum.phase1_filter == "orm" and orm_ref is not None:
        how = "orm"
        pages = start_page_html(settings, cands)
        scorer = OrmScorer(orm_ref.path, settings.orm, settings.models)
        p_yes = scorer.p_yes([build_orm_prompt(t["intent"], [], pages.get(t["start_url"], ""),
                                               settings.orm.max_html_chars, compat=fmt)
                              for t in cands])
        kept, dropped = filter_by_value(cands, [(x, x, x) for x in p_yes], curriculum.filter_low,
                                        curriculum.filter_high)
    else:
        how = "skip (no trained critic: phase 1, or a recipe without one)"
        kept, dropped = list(cands), []
    n_passed = len(kept)
    valued = [t for t in kept + dropped if "critic_value" in t]  # every candidate the filter scored (none: skipped)
    kept = top_up(kept, dropped, math.ceil(curriculum.min_kept_fraction * curriculum.tasks_per_phase),
                  curriculum.filter_low, curriculum.filter_high)
    rng = random.Random(settings.run.seed * 31 + phase)
    rng.shuffle(kept)
    kept = top_up_sites(kept[: curriculum.tasks_per_phase], dropped, curriculum.min_kept_per_site,
                        curriculum.filter_low, curriculum.filter_high)
    kept = sorted(kept, key=lambda t: t["task_id"])
    key = output_key(settings, candidates_ref, critic_ref, trained_critic, orm_ref)
    ref = write_json_version(kept, phase_dir(run_dir, "tasks", phase) / "filtered.json", key)
    if valued:  # where the window cut each site: every scored candidate, its value and whether the phase runs it
        ran = {t["task_id"] for t in kept}
        write_json_version(sorted((dict(t, kept=t["task_id"] in ran) for t in valued), key=lambda t: t["task_id"]),
                           phase_dir(run_dir, "tasks", phase) / "valued.json", key)
    values = {f"{how}_value_{stat}_{site}": v for site, row in value_by_site(valued).items()
              for stat, v in row.items() if stat != "n"}
    return ref, {"filter": how, "candidates": len(cands), "kept_by_critic": n_passed, "kept": len(kept),
                 "topped_up": sum(1 for t in kept if t.get("filter_top_up")), "dropped": len(dropped),
                 **{f"kept_{k}": v for k, v in count_sites(kept).items()}, **values}
