"""`webrl bench next-action`: each phase's actor of a run marked on the same validation steps."""

import json
import os

from typer.testing import CliRunner

from webrl_cli.main import app
from webrl_core.pretrained import resolve_model_ref
from benchmarks.next_action import model_labels, run_actors
from webrl_core.errors import MissingInput

SETS = ["models.actor=smollm2-135m-instruct", "models.max_length=640", "prompt.style=chat",
        "prompt.observation=compact", "policy.max_new_tokens=24"]


def _run_with_phases(root, model_dir, phases):
    """A run dir whose models/phase=k/actor point at ``model_dir``, as ``rundir.publish`` leaves them."""
    for k in phases:
        d = root / "models" / f"phase={k}"
        d.mkdir(parents=True)
        os.symlink(model_dir, d / "actor")
    return root


def test_phase_actors_in_phase_order(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    run = _run_with_phases(tmp_path / "run", model, [10, 0, 2])
    (run / "models" / "phase=3").mkdir()  # a phase whose actor was never published
    assert [label for label, _ in run_actors(run)] == ["SFT (phase 0)", "phase 2", "phase 10"]


def test_each_phase_and_a_named_model_on_the_same_steps(tmp_path):
    """The same weights under phase 0, phase 1 and --model answer the same steps identically (greedy); the
    marks are shares of the steps; a run without actors is refused by name."""
    smollm = resolve_model_ref("smollm2-135m-instruct")
    run = _run_with_phases(tmp_path / "run", smollm, [0, 1])
    out = tmp_path / "na"
    common = ["--config", "smoke", "--demos", "2", "--val-tasks", "2", "--val-steps", "3",
              "--run-dir", str(tmp_path / "bench"), *[a for s in SETS for a in ("--set", s)]]
    res = CliRunner().invoke(app, ["bench", "next-action", "--run", str(run), "--model", str(smollm),
                                   "--out", str(out), *common])
    assert res.exit_code == 0, res.output
    r = json.loads(out.with_suffix(".json").read_text())
    assert [row["label"] for row in r["rows"]] == ["SFT (phase 0)", "phase 1", "smollm2-135m-instruct"]
    marks = [{k: row[k] for k in ("exact", "element", "typed_args", "well_formed", "exact_n")} for row in r["rows"]]
    assert marks[0] == marks[1] == marks[2] and marks[0]["exact_n"] == 3 == r["val_steps"]
    assert sum(m["exact_n"] for m in r["rows"][0]["by_site"].values()) == 3 and "unknown" not in r["rows"][0]["by_site"]
    assert all(0 <= row["exact"] <= row["well_formed"] <= 1 for row in r["rows"])
    assert out.with_suffix(".png").stat().st_size > 0 and " cores, " in r["cpu"]

    empty = tmp_path / "empty"
    (empty / "models").mkdir(parents=True)
    res = CliRunner().invoke(app, ["bench", "next-action", "--run", str(empty), "--out", str(out), *common])
    assert isinstance(res.exception, MissingInput) and "no published actor under" in str(res.exception)


def test_marks_per_site_partition_the_steps():
    """Per-site marks count each step once, under its task's site; the overall share is their weighted mean."""
    from benchmarks.next_action import by_site
    from benchmarks.sft_curve import score

    click = 'do(action="Click", element="{}")'
    steps = [{"site": "reddit", "action": click.format(11)}, {"site": "reddit", "action": click.format(12)},
             {"site": "gitlab", "action": click.format(3)}, {"action": click.format(4)}]
    marks = [score(click.format(16), steps[0]["action"]), score(click.format(12), steps[1]["action"]),
             score(click.format(3), steps[2]["action"]), score(click.format(4), steps[3]["action"])]
    sites = by_site(marks, steps)
    assert sorted(sites) == ["gitlab", "reddit", "unknown"]
    assert (sites["reddit"]["exact"], sites["reddit"]["exact_n"]) == (0.5, 2)
    assert (sites["gitlab"]["exact"], sites["unknown"]["exact"]) == (1.0, 1.0)
    assert sum(m["exact"] * m["exact_n"] for m in sites.values()) == 3


def test_named_models_are_labelled_by_the_path_that_tells_them_apart(tmp_path):
    a, b = tmp_path / "ep2" / "models" / "phase=1" / "actor", tmp_path / "beta05" / "models" / "phase=1" / "actor"
    assert model_labels([a, b]) == ["ep2/models/phase=1/actor", "beta05/models/phase=1/actor"]
    assert model_labels([a, tmp_path / "sft-ckpt"]) == ["actor", "sft-ckpt"]
    assert model_labels([a]) == ["actor"]
