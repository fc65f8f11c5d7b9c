"""The recipes (webrl_core.experiments.recipes): each packaged recipe file is the demo plus its own overrides, the
ablation takes recipes as variants, the flow names a config's recipe, and the recipe knobs refuse what cannot work."""

from __future__ import annotations

import pytest

from webrl_core.config_loader import ConfigError, load_config
from webrl_core.experiments import ablation, recipes


@pytest.mark.parametrize("name", ["grpo", "pae"])
def test_a_recipe_is_the_demo_plus_its_overrides(name):
    whole = load_config(recipes.RECIPES[name]).model_dump()
    via_overrides = load_config("demo", sets=recipes.recipe_overrides(name)).model_dump()
    whole["run"].pop("name"), via_overrides["run"].pop("name")
    assert whole == via_overrides
    assert ablation.variant_overrides(name) == recipes.recipe_overrides(name)
    assert recipes.recipe_of(load_config(recipes.RECIPES[name])) == name


def test_the_recipes_change_what_they_say():
    grpo, pae, webrl = (load_config(recipes.RECIPES[n]) for n in ("grpo", "pae", "webrl"))
    assert (grpo.actor.loss, grpo.curriculum.generator, grpo.replay.enabled) == ("grpo", "train_pool", False)
    assert grpo.curriculum.rollouts_per_task * grpo.curriculum.tasks_per_phase == webrl.curriculum.tasks_per_phase
    assert (pae.actor.loss, pae.curriculum.generator, pae.reward.source) == ("filtered_bc", "propose", "judge")
    assert recipes.recipe_overrides("webrl") == [] and recipes.recipe_of(webrl) == "webrl"
    # everything else is the demo's: the same start, test subset and actor learning rate
    for s in (grpo, pae):
        assert s.bootstrap == webrl.bootstrap and s.eval == webrl.eval and s.actor.lr == webrl.actor.lr


def test_unknown_recipe_and_variant_are_named():
    with pytest.raises(ValueError, match="unknown recipe 'ppo'; known: webrl, grpo, pae"):
        recipes.recipe_overrides("ppo")
    with pytest.raises(ValueError, match="recipes: webrl, grpo, pae"):
        ablation.variant_overrides("ppo")


@pytest.mark.parametrize("sets, message", [
    (["actor.loss=grpo"], "set curriculum.rollouts_per_task >= 2"),
    (["reward.source=judge"], "reward.source=judge needs reward.judge"),
    (["reward.judge=http://127.0.0.1:9/v1", "reward.judge_screenshots=3"], "set env.screenshots: true"),
    (["curriculum.generator=propose", "curriculum.base_url=http://127.0.0.1:9/v1", "reward.source=env"],
     "set reward.source to judge"),
    (["prompt.observation=compact+screenshot"], "policy.backend='hf' is an in-process text model"),
])
def test_recipe_knobs_without_their_counterparts_are_refused(sets, message):
    with pytest.raises(ConfigError, match=message):
        load_config("demo", sets=sets)
