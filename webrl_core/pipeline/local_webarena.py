"""The inputs of the real-model path, made on this machine: what a GPU user brings from outside, written here so that
the whole path (``configs/webarena-local.yaml``) runs without a model hub or WebArena's docker images.

The embedded sites stand in for WebArena (``webrl sites serve``; ``SHOPPING``, ``GITLAB``, ... point at them), and
``prepare_local_inputs`` writes into one folder:

* ``base-model/``: an HF folder of a real architecture (``models.embedded.arch``: Llama or Qwen2), randomly
  initialised by the project (what a user downloads as Llama-3.1-8B);
* ``orm-model/``: the ORM's HF folder, the same architecture, untrained (what the released WebRL ORM is; its
  labels are only reported when ``reward.source: env``);
* ``sft_demos.sharegpt.json``: the SFT demonstrations in the official LLaMA-Factory ShareGPT format
  (``webrl_core.learn.sft_data``), from the oracle's successful episodes on training tasks, acted through the served sites;
* ``seed_tasks.raw.json``: training tasks in WebArena-Lite format (``__SHOPPING__``-style placeholders), which the
  SFT actor rolls out in phase 0 to give phase 1 its failures (``curriculum.seed_tasks``);
* ``test_tasks.raw.json``: the 165-task held-out set in the same format (``eval.test_set``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from webrl_core.config import LOCAL_INPUT_FILES, EmbeddedModelConfig
from webrl_core.learn.sft_data import episode_pairs, write_sharegpt
from webrl_core.websites import SITES


def as_webarena_lite(task: dict) -> dict:
    """An embedded task in strict WebArena-Lite format: its 13 fields, the login state named as WebArena names it
    (``./.auth/<sites>_state.json``); the family stays encoded in ``intent_template_id`` (``sites.tasks``)."""
    from webrl_core.env.browser import state_file_name
    from webrl_core.env.webarena_login import LOGIN_SITES

    logins = [s for s in task["sites"] if s in LOGIN_SITES]
    out = {k: v for k, v in task.items() if k not in ("family", "split", "data_seed")}
    out["old_task_id"] = task.get("old_task_id")
    if task.get("require_login") and logins:
        out["storage_state"] = f"./.auth/{state_file_name(logins)}"
    return out


def _write_tasks(tasks: list[dict], path: Path) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps([as_webarena_lite(t) for t in tasks], indent=1), encoding="utf-8")
    tmp.replace(path)
    return path


def oracle_demonstrations(tasks: list[dict], urls: dict[str, str], env_cfg: Any, compat: str, auth_dir: str
                          ) -> list[tuple[str, str]]:
    """The oracle's (prompt, action) pairs on ``tasks``, acted through the sites at ``urls`` (WebArena's hooks):
    the prompts are exactly what the actor will see there."""
    from webrl_core.env.browser import WebArenaHooks
    from webrl_core.env.rollout import run_rollout
    from webrl_core.env.webarena_login import LOGIN_SITES
    from webrl_core.sites.oracle import OraclePolicy

    hooks = WebArenaHooks(urls, auth_dir=auth_dir, login_sites=LOGIN_SITES)
    eps = run_rollout(tasks, OraclePolicy(), env_cfg.n_envs, cfg=env_cfg, hooks=hooks, purpose="oracle",
                      progress=True, prompt_compat=compat)
    return episode_pairs(eps, {e["episode_id"]: e["steps"] for e in eps})


def prepare_local_inputs(out_dir: str | Path, urls: dict[str, str], *, demo_tasks: int = 80, seed_tasks: int = 24,
                         model: EmbeddedModelConfig | None = None, env_cfg: Any = None, compat: str = "webrl",
                         data_seed: int = 0, seed: int = 0, auth_dir: str = ".auth") -> dict[str, str]:
    """Write the inputs listed in the module docstring into ``out_dir``; returns their paths by config field."""
    from webrl_core.config import EnvConfig
    from webrl_core.learn.embedded_model import build_embedded_model, train_embedded_tokenizer
    from webrl_core.prompts import build_orm_prompt
    from webrl_core.sites.tasks import test_set, train_tasks

    missing = sorted(set(SITES) - set(urls))
    if missing:
        raise ValueError(f"no URL for site(s) {missing}: start `webrl sites serve` and export the SHOPPING, "
                         f"SHOPPING_ADMIN, GITLAB, REDDIT, MAP variables it prints")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    env_cfg = env_cfg or EnvConfig()
    model = model or EmbeddedModelConfig(hidden_size=128, intermediate_size=256, num_layers=2, num_heads=2,
                                         vocab_size=2048, max_length=2048)
    paths = {k: str((out / v).resolve()) for k, v in LOCAL_INPUT_FILES.items()}

    demos = train_tasks(demo_tasks, seed=seed * 1000 + 11, data_seed=data_seed)
    seeds = train_tasks(seed_tasks, seed=seed * 1000 + 12, data_seed=data_seed)
    for t in seeds:
        t["task_id"] = f"seed-{t['task_id']}"
    _write_tasks(seeds, Path(paths["seed_tasks"]))
    _write_tasks(test_set(data_seed=data_seed), Path(paths["test_set"]))

    pairs = oracle_demonstrations(demos, urls, env_cfg, compat, auth_dir)
    if not pairs:
        raise RuntimeError(f"the oracle solved none of {len(demos)} demonstration tasks at {urls}: are the sites "
                           f"`webrl sites serve` with the same --data-seed ({data_seed})?")
    write_sharegpt(pairs, paths["sft_data"])

    # the tokenizer learns the run's text: prompts, actions and the ORM's question
    texts = [p + a for p, a in pairs] + [build_orm_prompt("intent", [a for _, a in pairs[:4]], p[-2000:],
                                                          compat=compat) + "YES NO" for p, _ in pairs[:200]]
    tok_dir = out / ".tokenizer"
    train_embedded_tokenizer(texts, model.vocab_size, tok_dir)
    build_embedded_model(tok_dir, model, paths["base_model"], seed=seed)
    build_embedded_model(tok_dir, model, paths["orm"], seed=seed + 1)
    (out / "inputs.json").write_text(json.dumps({"paths": paths, "demo_pairs": len(pairs), "demo_tasks": demo_tasks,
                                                 "seed_tasks": seed_tasks, "urls": urls,
                                                 "model": model.model_dump()}, indent=1))
    return paths
