"""Episode identity by content (webrl_core.identity) and checkpoint digests kept in manifests (artifacts)."""

import json
import os
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from webrl_core import identity
from webrl_core.artifacts import MANIFEST, ArtifactRef, sha256_path
from webrl_core.config import EnvConfig, PolicyConfig
from webrl_core.sites import test_set as embedded_test_set
from webrl_core.runs.store import SCHEMA_VERSION, StoreError, TrajectoryStore


def _key(task, **kw):
    args = dict(purpose="eval", phase=1, task_digest=identity.task_digest(task), policy_digest="hf:a",
                settings_digest=identity.settings_digest(EnvConfig()), seed=0, attempt=0)
    args.update(kw)
    return identity.episode_id(task["task_id"], **args)


def test_episode_id_changes_with_every_input_and_only_then():
    task = embedded_test_set()[0]
    base = _key(task)
    assert _key(dict(task)) == base  # same inputs: same id (resume is free)
    assert _key(dict(task, family="other", critic_value=0.3)) == base  # bookkeeping is not content
    changed = [
        _key(task, task_digest=identity.task_digest(dict(task, intent=task["intent"] + "?"))),
        _key(task, task_digest=identity.task_digest(dict(task, eval={**task["eval"], "reference_answers": {}}))),
        _key(task, task_digest=identity.task_digest(dict(task, start_url=task["start_url"] + "/x"))),
        _key(task, policy_digest="hf:b"),
        _key(task, settings_digest=identity.settings_digest(EnvConfig(max_steps=7))),
        _key(task, settings_digest=identity.settings_digest(EnvConfig(), temperature=0.5, policy_cfg=PolicyConfig())),
        _key(task, seed=1), _key(task, attempt=1), _key(task, phase=2), _key(task, purpose="rollout"),
    ]
    assert base not in changed and len(set(changed)) == len(changed)


def test_action_seed_is_fixed_per_episode_and_step():
    eid = "rollout-p1-t-a0-0123456789abcdef"
    seeds = [identity.action_seed(eid, step) for step in range(20)]
    assert seeds == [identity.action_seed(eid, step) for step in range(20)]
    assert len(set(seeds)) == 20 and all(0 <= s < 1 << 63 for s in seeds)
    assert identity.action_seed(eid[:-1] + "0", 0) != seeds[0]
    with pytest.raises(ValueError, match="episode id"):
        identity.action_seed("", 0)
    # sampling with or without per-action seeds are different episodes; greedy decoding is the same either way
    sampled, greedy = ([identity.settings_digest(EnvConfig(), temperature=t, policy_cfg=PolicyConfig(seeded=seeded))
                        for seeded in (True, False)] for t in (1.0, 0.0))
    assert sampled[0] != sampled[1] and greedy[0] == greedy[1]


def test_throughput_settings_do_not_enter_the_key():
    assert identity.settings_digest(EnvConfig()) == identity.settings_digest(
        EnvConfig(n_envs=8, batch_wait_s=0.0, screenshots=True, episode_retries=3, chromium_path="/usr/bin/chromium"))


def test_generated_task_ids_derive_from_content():
    a, b = embedded_test_set()[0], embedded_test_set()[1]
    assert identity.generated_task_id(2, dict(a, task_id="x")) == identity.generated_task_id(2, dict(a, task_id="y"))
    assert identity.generated_task_id(2, a) != identity.generated_task_id(2, b)
    with pytest.raises(ValueError, match="no start_url"):
        identity.task_digest({"task_id": "t", "intent": "i", "eval": {}})


def test_manifest_is_written_once_and_invalidated_by_any_change(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(os.urandom(1 << 20))
    (ckpt / "config.json").write_text("{}")
    d1 = sha256_path(ckpt)
    assert json.loads((ckpt / MANIFEST).read_text())["sha256"] == d1
    assert sha256_path(ckpt, use_manifest=False) == d1  # the manifest does not enter the digest
    # a stale manifest (the weights were rewritten) is never trusted
    time.sleep(0.01)
    (ckpt / "model.safetensors").write_bytes(os.urandom(1 << 20))
    d2 = sha256_path(ckpt)
    assert d2 != d1 and d2 == sha256_path(ckpt, use_manifest=False)
    (ckpt / "extra.bin").write_bytes(b"x")
    assert sha256_path(ckpt) != d2
    # a forged manifest with the right sizes/mtimes is what makes references cheap: it is read, not re-hashed
    m = json.loads((ckpt / MANIFEST).read_text())
    (ckpt / MANIFEST).write_text(json.dumps(dict(m, sha256="f" * 64)))
    assert ArtifactRef.of(ckpt).sha256 == "f" * 64
    assert ArtifactRef(str(ckpt), "f" * 64).verify(rehash=True) is False


def test_unwritable_folder_keeps_its_manifest_in_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    ckpt = tmp_path / "ro"
    ckpt.mkdir()
    (ckpt / "w.bin").write_bytes(b"abc")
    (ckpt / MANIFEST).mkdir()  # the manifest cannot be written inside (as in a read-only mount, also as root)
    d = sha256_path(ckpt)
    cached = list((tmp_path / "cache" / "webrl" / "manifests").glob("*.json"))
    assert len(cached) == 1 and json.loads(cached[0].read_text())["sha256"] == d
    assert sha256_path(ckpt) == d


def test_store_of_the_previous_schema_fails_clearly_then_migrates(tmp_path):
    folder = tmp_path / "store" / "episodes" / "phase=0"
    folder.mkdir(parents=True)
    v1 = pa.table({"episode_id": ["old"], "task_id": ["t"], "phase": [0], "policy_id": ["hf:x@T1"], "purpose": ["eval"],
                   "status": ["done"], "success": [True], "_batch": ["00000000000000000001-aaaa"], "_schema": [1]})
    pq.write_table(v1, folder / "00000000000000000001-aaaa.parquet")
    with pytest.raises(StoreError, match=r"schema version 1.*reads version 2.*webrl store migrate"):
        TrajectoryStore(tmp_path)
    out = TrajectoryStore(tmp_path, check_version=False).migrate()
    assert out == {"from": 1, "to": SCHEMA_VERSION, "episodes": 1}
    rows = TrajectoryStore(tmp_path).episodes()
    assert rows[0]["episode_id"] == "old" and rows[0]["policy_digest"] == "legacy:hf:x@T1"
    (tmp_path / "store" / "schema.json").write_text(json.dumps({"version": SCHEMA_VERSION + 1}))
    with pytest.raises(StoreError, match="newer webrl"):
        TrajectoryStore(tmp_path)
