import warnings

import pytest

from webrl_core.config import RENAMED, WebRLSettings
from webrl_core.config_loader import (ConfigError, describe_fields, dump_config, env_site_urls, load_config,
                                     packaged_config_names)


def test_defaults_resolve_and_every_field_is_described():
    cfg = load_config()
    assert cfg.env.max_steps == 30 and cfg.env.obs_char_budget == 15872
    assert cfg.curriculum.filter_low == 0.05 and cfg.curriculum.filter_high == 0.75
    assert cfg.transitions.gamma == 0.9 and cfg.curriculum.api_key_env == cfg.policy.api_key_env == "OPENAI_API_KEY"
    assert (cfg.bootstrap.sft_lr, cfg.bootstrap.sft_epochs, cfg.bootstrap.sft_loss) == (1e-3, 8.0, "completion")
    assert cfg.replay.low == 0.5 and cfg.replay.high == 0.95 and cfg.replay.cap_ratio == 2.0
    rows = describe_fields()
    assert len(rows) > 80
    assert all(desc for _, desc, _ in rows), [n for n, d, _ in rows if not d]


def test_extends_overlay_and_set(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("run: {name: base, seed: 3}\nenv: {n_envs: 3}\n")
    child = tmp_path / "child.yaml"
    child.write_text("extends: base.yaml\nrun: {name: child}\n")
    overlay = tmp_path / "ov.yaml"
    overlay.write_text("actor: {loss: paper}\n")
    cfg = load_config(child, [overlay], ["env.n_envs=7", "replay.low=0.4"])
    assert (cfg.run.name, cfg.run.seed, cfg.env.n_envs) == ("child", 3, 7)
    assert cfg.actor.loss == "paper" and cfg.replay.low == 0.4
    # packaged names work in extends and as the file, even beside a directory of the same name (a run dir)
    assert load_config("smoke").run.name == "smoke"
    (tmp_path / "smoke").mkdir()
    (tmp_path / "mine.yaml").write_text("extends: smoke\n")
    assert load_config(tmp_path / "mine.yaml").run.name == "smoke"
    assert "run:" in dump_config(cfg)


def test_unknown_key_names_file_field_and_allowed(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("env: {n_env: 4}\n")
    with pytest.raises(ConfigError) as e:
        load_config(f)
    msg = str(e.value)
    assert str(f) in msg and "env.n_env" in msg and "n_envs" in msg


def test_wrong_type_and_literal_values(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("env: {n_envs: many}\nactor: {loss: huber}\n")
    with pytest.raises(ConfigError) as e:
        load_config(f)
    msg = str(e.value)
    assert "env.n_envs" in msg and "'many'" in msg
    assert "actor.loss" in msg and "'paper'" in msg and "'official'" in msg


def test_missing_file_and_missing_model_path(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="models.actor"):
        load_config(sets=[f"models.actor={tmp_path / 'no-such-model'}"])


def test_non_loopback_host_is_rejected():
    with pytest.raises(ConfigError, match="loopback"):
        load_config(sets=["sites.host=0.0.0.0"])


def test_entity_levers_are_refused_on_real_webarena():
    for field, value in (("models.embedded.entity_tokens", "true"), ("bootstrap.sft_entity_swap", "0.5")):
        with pytest.raises(ConfigError, match=rf"{field} uses the embedded sites' entity names; sites.mode is "
                                              r"'webarena'"):
            load_config(sets=["sites.mode=webarena", f"{field}={value}"])
        assert load_config(sets=[f"{field}={value}"]).sites.mode == "embedded"  # fine on the embedded sites


def test_breadth_is_refused_for_the_llm_generators():
    with pytest.raises(ConfigError, match=r"curriculum.breadth=0.5 applies to generator=embedded"):
        load_config(sets=["curriculum.generator=openai", "curriculum.base_url=http://127.0.0.1:9/v1",
                          "curriculum.breadth=0.5"])
    assert load_config(sets=["curriculum.breadth=0.5"]).curriculum.breadth == 0.5


def test_webarena_env_vars_override_urls():
    env = {"SHOPPING": "http://10.0.0.1:7770/", "WA_GITLAB": "http://10.0.0.1:8023", "REDDIT": ""}
    assert env_site_urls(env) == {"shopping": "http://10.0.0.1:7770", "gitlab": "http://10.0.0.1:8023"}
    cfg = load_config(environ=env)
    assert cfg.sites.urls["shopping"] == "http://10.0.0.1:7770"
    # the unprefixed name wins over the WA_ one
    assert env_site_urls({"MAP": "http://a", "WA_MAP": "http://b"}) == {"map": "http://a"}


def test_renamed_fields_still_work_with_a_warning(tmp_path):
    old = tmp_path / "old.yaml"
    old.write_text("critic: {filter_low: 0.1, filter_high: 0.6}\nactor: {gamma: 0.8, sft_lr: 0.01, sft_epochs: 3, "
                   "sft_loss: all, lr: 0.002}\n"
                   "eval: {fuzzy_judge_url: 'http://127.0.0.1:9/v1', fuzzy_judge_model: judge-m}\n")
    with pytest.warns(DeprecationWarning) as caught:
        cfg = load_config(old, sets=["critic.filter_high=0.7"])
    said = " ".join(str(w.message) for w in caught)
    for name, new in RENAMED.items():
        assert f"'{name}' is deprecated, use '{new}'" in said, name
    assert (cfg.curriculum.filter_low, cfg.curriculum.filter_high, cfg.transitions.gamma) == (0.1, 0.7, 0.8)
    assert (cfg.bootstrap.sft_lr, cfg.bootstrap.sft_epochs, cfg.bootstrap.sft_loss) == (0.01, 3.0, "all")
    assert (cfg.eval.judge, cfg.eval.judge_model) == ("http://127.0.0.1:9/v1", "judge-m")
    assert cfg.actor.lr == 0.002 and "gamma" not in cfg.actor.model_dump() and "filter_low" not in cfg.critic.model_dump()
    # the model itself maps them too (settings built from a dict)
    with pytest.warns(DeprecationWarning, match="'actor.sft_epochs' is deprecated, use 'bootstrap.sft_epochs'"):
        assert WebRLSettings.model_validate({"actor": {"sft_epochs": 2}}).bootstrap.sft_epochs == 2
    # a later layer wins whichever name each layer uses; both names in one layer must agree
    with pytest.warns(DeprecationWarning):
        assert load_config(old, sets=["bootstrap.sft_epochs=5"]).bootstrap.sft_epochs == 5
        assert load_config("smoke", sets=["actor.sft_epochs=1"]).bootstrap.sft_epochs == 1
    both = tmp_path / "both.yaml"
    both.write_text("actor: {gamma: 0.8}\ntransitions: {gamma: 0.7}\n")
    with pytest.raises(ConfigError, match="both 'actor.gamma' .deprecated. and 'transitions.gamma' are set"):
        load_config(both)


def test_new_names_load_without_warnings(tmp_path):
    new = tmp_path / "new.yaml"
    new.write_text("curriculum: {filter_low: 0.1, api_key_env: GEN_KEY}\ntransitions: {gamma: 0.8}\n"
                   "bootstrap: {sft_epochs: 3}\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg = load_config(new, sets=["curriculum.filter_high=0.7", "bootstrap.sft_loss=all"])
        for name in packaged_config_names():  # the packaged configs use the new names
            if name != "webarena-local":  # its model and task paths exist after `webrl webarena local-setup`
                load_config(name)
        assert WebRLSettings.model_validate(cfg.model_dump(mode="json")) == cfg  # a dump round-trips
    assert (cfg.curriculum.filter_low, cfg.curriculum.filter_high, cfg.transitions.gamma) == (0.1, 0.7, 0.8)
    assert (cfg.bootstrap.sft_epochs, cfg.bootstrap.sft_loss, cfg.curriculum.api_key_env) == (3.0, "all", "GEN_KEY")
    assert cfg.policy.api_key_env == "OPENAI_API_KEY"
    for gone in ("actor.gamma", "critic.filter_low"):
        section, key = gone.split(".")
        bad = tmp_path / "bad.yaml"
        bad.write_text(f"{section}: {{{key}x: 1}}\n")
        with pytest.raises(ConfigError, match="unknown key"):
            load_config(bad)


def test_curriculum_api_key_env_follows_a_custom_policy_one_for_a_release():
    """The curriculum's OpenAI generator used to read policy.api_key_env: a run that set only that keeps working."""
    with pytest.warns(DeprecationWarning, match="curriculum.api_key_env"):
        cfg = load_config(sets=["policy.api_key_env=MY_KEY", "curriculum.generator=openai"])
    assert cfg.curriculum.api_key_env == "MY_KEY"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        own = load_config(sets=["policy.api_key_env=MY_KEY", "curriculum.generator=openai",
                                "curriculum.api_key_env=GEN_KEY"])
        assert own.curriculum.api_key_env == "GEN_KEY"
        assert load_config(sets=["policy.api_key_env=MY_KEY"]).curriculum.api_key_env == "OPENAI_API_KEY"


def test_an_sft_checkpoint_replaces_the_whole_bootstrap_only_with_seed_tasks_or_off_the_embedded_sites(tmp_path):
    from webrl_core.pipeline.validate import BadInputError, check_real_path

    ckpt = tmp_path / "sft"
    ckpt.mkdir()
    seeds = tmp_path / "seeds.json"
    seeds.write_text("[]")
    embedded = load_config("smoke", sets=[f"bootstrap.sft_actor={ckpt}"])
    assert not embedded.bootstrap_from_checkpoints()  # the embedded bootstrap, the checkpoint in the SFT's place
    check_real_path(embedded, "train")  # it trains its own ORM: models.orm is not needed
    with_seeds = load_config("smoke", sets=[f"bootstrap.sft_actor={ckpt}", f"curriculum.seed_tasks={seeds}"])
    assert with_seeds.bootstrap_from_checkpoints()
    with pytest.raises(BadInputError, match="models.orm must name"):
        check_real_path(with_seeds, "train")
    assert load_config("smoke", sets=[f"bootstrap.sft_data={seeds}"]).bootstrap_from_checkpoints()
    assert not load_config("smoke").bootstrap_from_checkpoints()


def test_the_demo_in_float32_by_the_cpus_choice_says_what_it_costs(monkeypatch):
    from webrl_cli.run_cmd import fp32_demo_hint
    from webrl_core.hardware import CPU_DTYPE_ENV

    monkeypatch.setenv(CPU_DTYPE_ENV, "float32")  # as `models.dtype: auto` chooses on an AVX2-only CPU
    assert "expect well over an hour" in fp32_demo_hint("demo", load_config("demo"))
    assert fp32_demo_hint("demo-full", load_config("demo-full")) is None  # says what it costs in its own header
    assert fp32_demo_hint("demo", load_config("demo", sets=["models.dtype=float32"])) is None  # chosen by hand
    monkeypatch.setenv(CPU_DTYPE_ENV, "bfloat16")
    assert fp32_demo_hint("demo", load_config("demo")) is None
