"""The decode step's matmul form, chosen by measurement per weight shape (webrl_core/agent/decode_linear.py)."""

from __future__ import annotations

import json

import pytest
import torch

from webrl_core.agent import decode_linear
from webrl_core.agent.decode_linear import DecodeLinear
from webrl_core.agent.policy import HFPolicy
from webrl_core.config import EmbeddedModelConfig, ModelsConfig, PolicyConfig
from webrl_core.learn import box_measurements
from webrl_core.learn.embedded_model import build_embedded_model, train_embedded_tokenizer
from webrl_core.prompts import build_prompt


@pytest.fixture
def measuring(monkeypatch, tmp_path):
    monkeypatch.setenv(box_measurements.CALIBRATE_ENV, "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("form", ["weights_first", "packed"])
@pytest.mark.parametrize("bias", [False, True])
def test_decode_linear_is_the_linear_at_any_rows(bias, form, dtype):
    torch.manual_seed(0)
    lin = torch.nn.Linear(24, 40, bias=bias).to(dtype)
    ref = {k: v.clone() for k, v in lin.state_dict().items()}
    x = torch.randn(3, 5, 24, dtype=dtype)
    expected = {rows: lin(x[:, :rows]) for rows in (1, 2, 5)}
    packed = decode_linear.packed_weight(lin.weight, 4)
    if form == "packed" and packed is None:
        pytest.skip(f"no oneDNN packed linear for {dtype} in this torch build")
    lin.__class__ = DecodeLinear  # 3x1 and 3x2 in the form, 3x5 linear
    lin.row_forms, lin.packed = {3: form, 6: form}, packed
    used = []
    real_mm = torch.mm
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch, "mm", lambda *a: used.append("mm") or real_mm(*a))
        for rows, want in expected.items():
            got = lin(x[:, :rows])
            assert got.shape == want.shape and got.is_contiguous()
            tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {}
            torch.testing.assert_close(got, want, **tol)
    assert used == (["mm"] * 2 if form == "weights_first" else [])  # 3 and 6 rows weights-first, 15 not
    assert lin(torch.randn(24, dtype=dtype)).shape == (40,)  # a 1-D input: F.linear
    assert {k: v for k, v in lin.state_dict().items()}.keys() == ref.keys()  # the packed copy is not state


def _linear_model():
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16),
                               torch.nn.Linear(16, 64))


def _times(linear, weights_first, packed=None):
    return {"linear": linear, "weights_first": weights_first} | ({} if packed is None else {"packed": packed})


def test_apply_swaps_the_shapes_measured_faster_and_keeps_the_choice(measuring, monkeypatch):
    # a BLAS on which only the 16 -> 64 shape runs faster weights-first (the timings come from this stand-in)
    timed: list[tuple[tuple[int, ...], int]] = []

    def fake_times(weight, rows, packed):
        timed.append((tuple(weight.shape), rows))
        return _times(2.0, 1.0) if tuple(weight.shape) == (64, 16) else _times(1.0, 1.0)

    monkeypatch.setattr(decode_linear, "_time_forms", fake_times)
    model = _linear_model()
    assert decode_linear.apply(model, 4) == 2
    assert [type(m) for m in model] == [DecodeLinear, torch.nn.ReLU, torch.nn.Linear, DecodeLinear]
    assert model[0].row_forms == dict.fromkeys((1, 2, 3, 4), "weights_first")
    counts = (1, 2, 4)
    assert sorted(timed) == [((16, 64), r) for r in counts] + [((64, 16), r) for r in counts]  # each once
    kept = json.loads(decode_linear.cache_file().read_text())
    assert sorted((e["shape"], e["rows"], e["form"]) for e in kept.values()) == \
        [([16, 64], r, "linear") for r in counts] + [([64, 16], r, "weights_first") for r in counts]
    timed.clear()
    again = _linear_model()
    assert decode_linear.apply(again, 4) == 2 and timed == []  # kept for this box: not measured again
    assert decode_linear.apply(_linear_model(), 6) == 2 and sorted(timed) == [((16, 64), 6), ((64, 16), 6)]


def test_a_packed_win_runs_the_packed_copy_and_a_tie_keeps_linear(measuring, monkeypatch):
    if decode_linear.packed_weight(torch.nn.Linear(16, 64).weight, 4) is None:
        pytest.skip("no oneDNN packed linear in this torch build")
    # packed wins at 1-2 rows, ties at 4 (within TIE): 3-4 rows keep F.linear, and so does a prefill's 300
    monkeypatch.setattr(decode_linear, "_time_forms", lambda w, rows, packed: _times(
        1.0, 1.5, 0.5 if rows <= 2 else 0.95))
    model = _linear_model()
    assert decode_linear.apply(model, 4) == 3
    lin = model[0]
    assert lin.row_forms == dict.fromkeys((1, 2), "packed")
    assert lin.packed is not None and "packed" not in str(lin.state_dict().keys())
    calls = []
    real = torch.ops.mkldnn._linear_pointwise
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", lambda *a: calls.append(1) or real(*a))
    x = torch.randn(300, 16)
    for rows, packed in ((1, True), (2, True), (4, False), (300, False)):
        calls.clear()
        torch.testing.assert_close(lin(x[:rows]), torch.nn.functional.linear(x[:rows], lin.weight, lin.bias),
                                   atol=1e-4, rtol=1e-4)
        assert bool(calls) == packed, rows


@pytest.mark.parametrize("max_rows,want", [(1, []), (2, [2]), (6, [2, 4, 6]), (8, [2, 4, 8])])
def test_measured_rows(max_rows, want):
    assert decode_linear.measured_rows(max_rows) == [1] + want


def test_each_row_count_goes_by_its_own_measurement(measuring, monkeypatch):
    # weights-first loses at 1 and at 8 rows, wins at 2 and 4: rows 2-4 take it, 5-8 and 1 keep F.linear
    monkeypatch.setattr(decode_linear, "_time_forms",
                        lambda w, rows, packed: _times(2.0, 1.0) if rows in (2, 4) else _times(1.0, 3.0))
    model = _linear_model()
    assert decode_linear.apply(model, 8) == 3
    assert model[0].row_forms == dict.fromkeys((2, 3, 4), "weights_first")
    calls = []
    monkeypatch.setattr(torch, "mm", lambda *a, real=torch.mm: calls.append(1) or real(*a))
    x = torch.randn(8, 16)
    for rows, weights_first in ((1, False), (2, True), (4, True), (5, False), (8, False)):
        calls.clear()
        torch.testing.assert_close(model[0](x[:rows]), torch.nn.functional.linear(x[:rows], model[0].weight,
                                                                                  model[0].bias))
        assert bool(calls) == weights_first, rows


def test_calibration_off_keeps_linear(monkeypatch, tmp_path):
    monkeypatch.setenv(box_measurements.CALIBRATE_ENV, "0")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    model = _linear_model()
    assert decode_linear.apply(model, 4) == 0 and not decode_linear.cache_file().exists()


def test_policy_measures_here_and_generates_as_with_linear(measuring, tmp_path, monkeypatch):
    """A real measurement on this box; the choice must not change what the policy writes (greedy)."""
    prompts = [build_prompt(f"Open item {i}", [], f'<a id="3">item {i}</a>' * (1 + 5 * i)) for i in range(4)]
    train_embedded_tokenizer(prompts, 350, tmp_path / "tok")
    cfg = EmbeddedModelConfig(vocab_size=350, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
                              max_length=256)
    model_dir = build_embedded_model(tmp_path / "tok", cfg, tmp_path / "model", seed=0)
    plain = HFPolicy(model_dir, PolicyConfig(max_new_tokens=12, batch_size=4, decode_matmul="linear"),
                     ModelsConfig(max_length=256), temperature=0)
    assert not any(isinstance(m, DecodeLinear) for m in plain.model.modules())
    assert not decode_linear.cache_file().exists()  # decode_matmul: linear measures nothing
    # each form forced in turn: the policy writes the same either way
    for name, winner in (("weights_first", _times(2.0, 1.0, 3.0)), ("packed", _times(2.0, 3.0, 1.0)),
                         ("linear", _times(1.0, 2.0, 2.0))):
        monkeypatch.setattr(decode_linear, "cache_file", lambda n=name: tmp_path / f"kept-{n}.json")
        real = decode_linear._time_forms
        monkeypatch.setattr(decode_linear, "_time_forms", lambda w, rows, packed, t=winner: t)
        pol = HFPolicy(model_dir, PolicyConfig(max_new_tokens=12, batch_size=4), ModelsConfig(max_length=256),
                       temperature=0)
        forms = {f for m in pol.model.modules() if isinstance(m, DecodeLinear) for f in m.row_forms.values()}
        assert forms == ({name} if name != "linear" else set()), name
        assert pol.generate(prompts) == plain.generate(prompts), name
        monkeypatch.setattr(decode_linear, "_time_forms", real)
    # the real timing runs and keeps one entry per distinct weight shape
    monkeypatch.setattr(decode_linear, "cache_file", lambda: tmp_path / "real.json")
    pol = HFPolicy(model_dir, PolicyConfig(max_new_tokens=12, batch_size=4), ModelsConfig(max_length=256),
                   temperature=0)
    shapes = {tuple(m.weight.shape) for m in pol.model.modules() if isinstance(m, torch.nn.Linear)}
    kept = json.loads((tmp_path / "real.json").read_text())
    assert {tuple(e["shape"]) for e in kept.values()} == shapes
    assert all(e["us"]["linear"] > 0 and e["us"]["weights_first"] > 0 and e["form"] in decode_linear.FORMS
               for e in kept.values())
    assert pol.generate(prompts) == plain.generate(prompts)
