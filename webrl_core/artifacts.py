"""Content-addressed artifact references: large inputs/outputs travel between stages as (path, sha256).

Cache-key rule: a stage's cache key is a hash of its small inputs plus the ``sha256`` of each input
artifact, never the artifact's bytes or a pickled copy, so keys are cheap and exact: the same content at
the same or another path gives the same key; one changed byte gives a new one.

A folder's digest is the sha256 over the sorted (relative path, file sha256) pairs of its files.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

_CHUNK = 1 << 20


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def sha256_path(path: str | Path) -> str:
    p = Path(path)
    if p.is_file():
        return sha256_file(p)
    if not p.is_dir():
        raise FileNotFoundError(f"artifact path does not exist: {p}")
    h = hashlib.sha256()
    for f in sorted(x for x in p.rglob("*") if x.is_file() and not x.name.endswith(".tmp")):
        h.update(f.relative_to(p).as_posix().encode() + b"\0" + sha256_file(f).encode() + b"\n")
    return h.hexdigest()


@dataclass(frozen=True)
class ArtifactRef:
    """A file or folder identified by its content."""

    path: str
    sha256: str
    kind: str = "file"   # file | folder | model | dataset | taskset

    @classmethod
    def of(cls, path: str | Path, kind: str | None = None) -> "ArtifactRef":
        p = Path(path).resolve()
        return cls(str(p), sha256_path(p), kind or ("folder" if p.is_dir() else "file"))

    def verify(self) -> bool:
        return Path(self.path).exists() and sha256_path(self.path) == self.sha256

    def __str__(self) -> str:
        return f"{self.kind}:{self.sha256[:12]}:{self.path}"


def write_json(obj, path: str | Path) -> ArtifactRef:
    """Write JSON atomically (tmp + rename) and return its reference."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True, default=str))
    os.replace(tmp, p)
    return ArtifactRef.of(p, "file")


def read_json(ref: ArtifactRef | str | Path):
    return json.loads(Path(ref.path if isinstance(ref, ArtifactRef) else ref).read_text())


def ref_dict(ref: ArtifactRef) -> dict:
    return asdict(ref)
