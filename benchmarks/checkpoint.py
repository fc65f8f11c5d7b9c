"""`webrl bench checkpoint`: what referencing a checkpoint costs at flow start, with and without its manifest.

A phase flow references four checkpoints before its first stage (phase k-1 actor and critic, the SFT actor as
the critic's backbone, the ORM). Each reference needs the folder's content digest (``ArtifactRef``). Without a
manifest that is a full sha256 of every byte on every start; with the manifest written when the checkpoint was
saved it is a directory listing plus a small JSON read (``webrl_core.artifacts``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from webrl_core.artifacts import MANIFEST, sha256_path
from webrl_core.runs.rundir import model_ref

_SHARD = 256 << 20


def _make_checkpoint(folder: Path, size_bytes: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text('{"model_type": "llama"}')
    block = os.urandom(16 << 20)
    left, i = size_bytes, 0
    while left > 0:
        n = min(_SHARD, left)
        with open(folder / f"model-{i:05d}.safetensors", "wb") as fh:
            for _ in range(n // len(block)):
                fh.write(block)
            fh.write(block[: n % len(block)])
        left -= n
        i += 1


def _flow_start_refs(run_dir: Path) -> list[str]:
    """The references ``webrl_phase`` takes before its first stage (phase 1: actor/critic of phase 0, SFT, ORM)."""
    return [model_ref(run_dir, 0, name).sha256 for name in ("actor", "critic", "actor", "orm")]


def run(size_gb: float = 2.0, root: str | None = None, repeats: int = 3) -> dict:
    work = Path(tempfile.mkdtemp(prefix="webrl-bench-ckpt-", dir=root))
    try:
        run_dir = work / "run"
        ckpt = run_dir / "models" / "phase=0" / "actor"
        t = time.perf_counter()
        _make_checkpoint(ckpt, int(size_gb * (1 << 30)))
        print(f"wrote a {size_gb:g} GB checkpoint folder in {time.perf_counter() - t:.1f} s: {ckpt}")
        for name in ("critic", "orm"):  # same weights: the point is the cost per reference
            os.symlink("actor", ckpt.parent / name)
        (ckpt / MANIFEST).unlink(missing_ok=True)
        before = []
        for _ in range(repeats):  # what every flow start paid before manifests: a full hash per reference
            t = time.perf_counter()
            digests = [sha256_path(p, use_manifest=False) for p in
                       [ckpt, ckpt.parent / "critic", ckpt, ckpt.parent / "orm"]]
            before.append(time.perf_counter() - t)
        (ckpt / MANIFEST).unlink(missing_ok=True)  # the full hashes above wrote it; measure its first write
        t = time.perf_counter()
        first = sha256_path(ckpt)  # written once, when the checkpoint is saved
        write_s = time.perf_counter() - t
        after = []
        for _ in range(repeats):
            t = time.perf_counter()
            got = _flow_start_refs(run_dir)
            after.append(time.perf_counter() - t)
        assert set(got) == {first} == set(digests), "manifest digest differs from the full hash"
        out = {"size_gb": size_gb, "before_s": min(before), "manifest_write_s": write_s, "after_s": min(after)}
        print(f"flow start, 4 checkpoint references of {size_gb:g} GB each:\n"
              f"  before (full sha256 per reference): {out['before_s']:.2f} s (best of {repeats})\n"
              f"  once, when the checkpoint is saved: {write_s:.2f} s (hash + manifest)\n"
              f"  after (manifest, size/mtime checked): {1000 * out['after_s']:.2f} ms (best of {repeats})\n"
              f"  speed-up: {out['before_s'] / max(out['after_s'], 1e-9):.0f}x")
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)
