"""A stage's code identity (webrl_core/runs/code_identity.py): what it can run, not where that code lives."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from webrl_core.runs.code_identity import CodeIndex


def _package(root: Path, files: dict[str, str]) -> Path:
    pkg = root / "webrl_core"
    for name, text in {"__init__.py": "", **files}.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(textwrap.dedent(text))
    return pkg


STAGE = '''
    """The stage module."""
    from webrl_core.maths import scale
    from webrl_core import texts as t

    def stage(x):
        """Scales."""
        return scale(x) + len(t.GREETING)
'''
MATHS = '''
    FACTOR = 3

    def scale(x):
        return x * FACTOR

    def unrelated(x):
        return x - 1
'''
TEXTS = 'GREETING = "hello"\n'


def _identity(root: Path, files: dict[str, str]) -> str:
    return CodeIndex(_package(root, files)).identity("webrl_core.stage", "stage")


def test_moves_docstrings_comments_and_unreached_code_keep_the_identity(tmp_path):
    base = _identity(tmp_path / "a", {"stage.py": STAGE, "maths.py": MATHS, "texts.py": TEXTS})
    # scale and FACTOR moved to another module (imports follow), docstrings and comments edited
    moved = _identity(tmp_path / "b", {
        "stage.py": STAGE.replace("webrl_core.maths", "webrl_core.sub.scaling").replace("Scales.", "x times 3"),
        "sub/__init__.py": "",
        "sub/scaling.py": "from webrl_core.maths import FACTOR  # re-exported\n\n\ndef scale(x):\n"
                          "    return x * FACTOR  # the factor\n",
        "maths.py": "FACTOR = 3\n\n\ndef unrelated(x):\n    return x - 2\n",  # unreached code changed
        "texts.py": TEXTS})
    assert moved == base


@pytest.mark.parametrize("change", [
    {"maths.py": MATHS.replace("x * FACTOR", "x * FACTOR + 1")},  # a body the stage calls
    {"maths.py": MATHS.replace("FACTOR = 3", "FACTOR = 4")},  # a constant it reads
    {"texts.py": 'GREETING = "hi"\n'},  # through a module alias
    {"stage.py": STAGE.replace("def stage(x):", "def stage(x, y=2):")},  # a default
])
def test_a_change_to_code_the_stage_runs_changes_it(tmp_path, change):
    files = {"stage.py": STAGE, "maths.py": MATHS, "texts.py": TEXTS}
    assert _identity(tmp_path / "a", files) != _identity(tmp_path / "b", {**files, **change})


def test_code_started_by_module_name_counts(tmp_path):
    launcher = '''
        import subprocess, sys

        def stage():
            subprocess.run([sys.executable, "-m", "webrl_core.worker"])
    '''
    a = _identity(tmp_path / "a", {"stage.py": launcher, "worker.py": "STEPS = 1\n"})
    b = _identity(tmp_path / "b", {"stage.py": launcher, "worker.py": "STEPS = 2\n"})
    assert a != b


def test_the_library_stages_reach_their_own_code_only():
    from webrl_core.pipeline import bootstrap, updates
    from webrl_core.runs.code_identity import library_index

    index = library_index()
    actor = set(index.reach(updates.update_actor.__module__, "update_actor"))
    adopt = set(index.reach(bootstrap.adopt_actor.__module__, "adopt_actor"))
    word_tokenize = {d.dump for m in index.modules.values() for d in m.defined.get("word_tokenize", [])}
    assert word_tokenize and not word_tokenize & actor  # the actor update never runs an evaluator
    assert len(adopt) < len(actor)
    with pytest.raises(KeyError, match="not a top-level definition"):
        index.reach("webrl_core.pipeline.updates", "no_such_stage")


def test_renaming_a_local_keeps_the_identity_and_reusing_one_does_not_matter(tmp_path):
    before = '''
        def stage(xs):
            v = sum(xs)
            return [v * 2] + [v for v in xs]
    '''
    after = '''
        def stage(xs):
            total = sum(xs)
            return [total * 2] + [x for x in xs]
    '''
    changed = '''
        def stage(xs):
            total = sum(xs)
            return [total * 3] + [x for x in xs]
    '''
    ids = [_identity(tmp_path / str(i), {"stage.py": text}) for i, text in enumerate((before, after, changed))]
    assert ids[0] == ids[1] != ids[2]
    # a parameter's name is the callers' interface: renaming it is a change
    assert ids[1] != _identity(tmp_path / "p", {"stage.py": after.replace("xs", "items")})


def test_a_data_file_the_code_names_beside_it_is_code(tmp_path):
    """A page script or a template changes what the stage computes; a YAML config's values are its inputs; a package
    named by a string (a config section called "env") is not data."""
    stage = '''
        from pathlib import Path

        SCRIPT = (Path(__file__).with_name("page.js")).read_text()
        SECTIONS = ("env",)

        def stage():
            return SCRIPT, Path(__file__).with_name("configs")
    '''

    def identity(root, script="return 1;", config="a: 1\n", env="X = 1\n"):
        pkg = _package(root, {"stage.py": stage, "env/__init__.py": env})
        (pkg / "page.js").write_text(script)
        (pkg / "configs").mkdir()
        (pkg / "configs" / "demo.yaml").write_text(config)
        return CodeIndex(pkg).identity("webrl_core.stage", "stage")

    base = identity(tmp_path / "a")
    assert identity(tmp_path / "b", script="return 2;") != base
    assert identity(tmp_path / "c", config="a: 2\n") == base
    assert identity(tmp_path / "d", env="X = 2\n") == base  # not reached: a string naming a package is not code
