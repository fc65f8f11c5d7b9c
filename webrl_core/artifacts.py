"""Content-addressed artifact references: large inputs/outputs travel between stages as (path, sha256).

Cache-key rule: a stage's cache key is a hash of its small inputs plus the ``sha256`` of each input
artifact, never the artifact's bytes or a pickled copy, so keys are cheap and exact: the same content at
the same or another path gives the same key; one changed byte gives a new one.

A folder's digest is the sha256 over the sorted (relative path, file sha256) pairs of its files. It is
computed once, when the folder is written, and kept in a manifest (``webrl-manifest.json`` inside the folder,
or under ``~/.cache/webrl/manifests`` when the folder is read-only) with each file's size and mtime; a later
reference reads the manifest and re-hashes only if any file was added, removed, resized or touched. So a
reference to an 8B checkpoint costs a directory listing, not minutes of hashing.
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


MANIFEST = "webrl-manifest.json"
MANIFEST_VERSION = 1


def _folder_files(p: Path) -> dict[str, list[int]]:
    """{relative path: [size, mtime_ns]} of the files that make up a folder artifact."""
    out = {}
    for f in p.rglob("*"):
        if f.is_file() and not f.name.endswith(".tmp") and f.name != MANIFEST:
            st = f.stat()
            out[f.relative_to(p).as_posix()] = [st.st_size, st.st_mtime_ns]
    return out


def user_cache_dir() -> Path:
    """``~/.cache/webrl`` (``$XDG_CACHE_HOME/webrl`` when set): what webrl keeps per machine, outside every run dir
    (checkpoint manifests of read-only folders, transformers' architecture tables, measured micro-batches)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "webrl"


def replace_text(path: Path, text: str) -> None:
    """Write ``path`` atomically: a temporary file of this process beside it, then a rename, so concurrent writers
    and readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _cache_manifest_path(p: Path) -> Path:
    return user_cache_dir() / "manifests" / (hashlib.sha256(str(p).encode()).hexdigest()[:32] + ".json")


def _read_manifest(p: Path, files: dict[str, list[int]]) -> str | None:
    for m in (p / MANIFEST, _cache_manifest_path(p)):
        try:
            data = json.loads(m.read_text())
        except (OSError, ValueError):
            continue
        if data.get("version") == MANIFEST_VERSION and data.get("files") == files and data.get("sha256"):
            return data["sha256"]
    return None


def _write_manifest(p: Path, files: dict[str, list[int]], digest: str) -> None:
    blob = json.dumps({"version": MANIFEST_VERSION, "sha256": digest, "files": files}, indent=1, sort_keys=True)
    for m in (p / MANIFEST, _cache_manifest_path(p)):
        try:
            replace_text(m, blob)
            return
        except OSError:  # read-only folder: keep the manifest in the user's cache instead
            continue


def sha256_path(path: str | Path, use_manifest: bool = True) -> str:
    """Content digest of a file, or of a folder (from its manifest when every file still matches it)."""
    p = Path(path)
    if p.is_file():
        return sha256_file(p)
    if not p.is_dir():
        raise FileNotFoundError(f"artifact path does not exist: {p}")
    p = p.resolve()
    files = _folder_files(p)
    if use_manifest and (known := _read_manifest(p, files)):
        return known
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(rel.encode() + b"\0" + sha256_file(p / rel).encode() + b"\n")
    digest = h.hexdigest()
    if _folder_files(p) == files:  # unchanged while hashing: safe to remember
        _write_manifest(p, files, digest)
    return digest


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

    def verify(self, rehash: bool = False) -> bool:
        """Does the path still hold this content? ``rehash`` ignores the manifest and reads every byte."""
        return Path(self.path).exists() and sha256_path(self.path, use_manifest=not rehash) == self.sha256

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


def write_jsonl(rows: list[dict], path: str | Path) -> Path:
    """Write ``rows`` one JSON object per line, atomically (tmp + rename)."""
    p = Path(path)
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, p)
    return p


def read_jsonl(ref: ArtifactRef | str | Path) -> list[dict]:
    """The rows of a JSON-lines file (blank lines skipped)."""
    with open(ref.path if isinstance(ref, ArtifactRef) else ref) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def ref_dict(ref: ArtifactRef) -> dict:
    return asdict(ref)
