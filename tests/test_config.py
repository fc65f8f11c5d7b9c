import pytest

from webrl_core.config import ConfigError, describe_fields, dump_config, env_site_urls, load_config


def test_defaults_resolve_and_every_field_is_described():
    cfg = load_config()
    assert cfg.env.max_steps == 30 and cfg.env.obs_char_budget == 15872
    assert cfg.critic.filter_low == 0.05 and cfg.critic.filter_high == 0.75
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


def test_webarena_env_vars_override_urls():
    env = {"SHOPPING": "http://10.0.0.1:7770/", "WA_GITLAB": "http://10.0.0.1:8023", "REDDIT": ""}
    assert env_site_urls(env) == {"shopping": "http://10.0.0.1:7770", "gitlab": "http://10.0.0.1:8023"}
    cfg = load_config(environ=env)
    assert cfg.sites.urls["shopping"] == "http://10.0.0.1:7770"
    # the unprefixed name wins over the WA_ one
    assert env_site_urls({"MAP": "http://a", "WA_MAP": "http://b"}) == {"map": "http://a"}
