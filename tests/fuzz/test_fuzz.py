"""The fuzzing campaign's fast slice, its saved regressions, and checks of the tools.

- ``test_fast_slice``: the first ``FAST_SEEDS`` seeds of the campaign (``make fuzz`` runs
  10000): every one compiles, runs, runs the same twice and is within 1 LSB of the reference
  interpreter, or a documented tie (tests/fuzz/README.md).
- ``test_regression``: every minimised model in tests/fuzz/regressions/ (the spec is in its
  ``fuzz_spec`` metadata; inputs come from it) passes the same bar.
- ``test_slow_campaign`` (QFUSE_SLOW=1): 1000 seeds in this process.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.fuzz.generator import Spec, float_model, quantized_model, random_spec, fuzz_inputs
from tests.fuzz.harness import (
    TIE_EPS,
    Result,
    _reach,
    lsb_class,
    output_steps,
    run_model,
    run_spec,
    steps_apart,
)
from tests.fuzz.minimize import minimize

FAST_SEEDS = 60
REGRESSIONS = sorted((Path(__file__).parent / "regressions").glob("*.onnx"))


def _check(r: Result) -> None:
    assert not r.failed, (f"seed {r.seed}: {r.cls} ({r.lsb:g} LSB, first at {r.first!r}) "
                          f"{r.summary} {r.message}")


@pytest.mark.parametrize("seed", range(FAST_SEEDS))
def test_fast_slice(seed: int) -> None:
    _check(run_spec(random_spec(seed)))


@pytest.mark.parametrize("path", REGRESSIONS, ids=[p.stem for p in REGRESSIONS])
def test_regression(path: Path) -> None:
    model = onnx.load(path)
    meta = {p.key: p.value for p in model.metadata_props}
    spec = Spec.from_json(meta["fuzz_spec"])
    r = run_model(model, fuzz_inputs(spec), spec.seed, path.stem)
    _check(r)


def test_regressions_are_saved() -> None:
    assert len(REGRESSIONS) >= 1


def test_specs_are_deterministic_and_models_valid() -> None:
    quantized = 0
    for seed in range(20):
        a, b = quantized_model(random_spec(seed)), quantized_model(random_spec(seed))
        assert a.SerializeToString() == b.SerializeToString()
        onnx.checker.check_model(a, full_check=True)
        quantized += any(n.op_type in ("QuantizeLinear", "DynamicQuantizeLinear")
                         for n in a.graph.node)
    # quantize_static leaves a lone float op (Softmax, ...) float, quantize_dynamic a model
    # without a Conv / MatMul
    assert quantized >= 16


def test_dropping_an_op_keeps_the_others_weights() -> None:
    spec = Spec(5, [1, 4, 6, 6], [
        {"op": "Conv", "key": 0, "out": 4, "k": [3, 3], "stride": [1, 1], "dil": [1, 1],
         "pads": [1, 1, 1, 1], "groups": "1", "bias": True},
        {"op": "Relu", "key": 1},
        {"op": "Conv", "key": 2, "out": 3, "k": [1, 1], "stride": [1, 1], "dil": [1, 1],
         "pads": [0, 0, 0, 0], "groups": "1", "bias": False}], {"kind": "hand",
                                                                 "per_channel": False,
                                                                 "weight": "s8",
                                                                 "coverage": 1.0})
    full, dropped = float_model(spec), Spec(**{**spec.__dict__, "ops": [spec.ops[0],
                                                                        spec.ops[2]]})
    w = {t.name: onnx.numpy_helper.to_array(t) for t in full.graph.initializer}
    w2 = {t.name: onnx.numpy_helper.to_array(t) for t in float_model(dropped).graph.initializer}
    assert np.array_equal(w["w2"], w2["w2"]) and np.array_equal(w["w0"], w2["w0"])


def test_harness_measures_steps_and_classes() -> None:
    a = np.array([0.0, 0.5, 1.0], np.float32)
    assert steps_apart(a, a, 0.25) == 0 and lsb_class(0.0) == "exact"
    assert steps_apart(a + np.float32(0.25), a, 0.25) == 1 and lsb_class(1.0) == "le1"
    assert steps_apart(a, a + np.array([0, 0.75, 0], np.float32), 0.25) == 3
    assert lsb_class(3.0) == "le3" and lsb_class(4.0) == "worse"
    assert steps_apart(a, a[:2], 0.25) == np.inf
    assert Result(0, "", "worse").failed and not Result(0, "", "worse", tie=True).failed
    assert not Result(0, "", "le1").failed and Result(0, "", "compile").failed


def test_a_near_tie_reaches_its_lines_along_each_axis() -> None:
    """An absorbed quantizer's near tie may move its own position downstream and, through an
    op that mixes one axis (Softmax), every element on a line through it."""
    d = np.full((1, 3, 4), 0.3)
    d[0, 1, 2] = TIE_EPS / 2
    near = _reach(d, (1, 3, 4))
    assert near[0, 1].all() and near[0, :, 2].all() and near.sum() == 6
    assert _reach(d, (1, 6, 2)).all() and not _reach(np.full((2, 2), 0.3), (4,)).any()


def test_a_tie_spread_by_softmax_after_absorbed_quantizers_is_a_tie() -> None:
    """Seed 136000 (AveragePool → AveragePool → Softmax → Clip): where the second pool's
    average is an exact half step (x/s = 0.5000001), that absorbed quantizer may round either
    way, and the Softmax spreads it along its row to the output; no quantizer between is
    materialized. Counted as a tie (or exact where the plan rounds as the reference)."""
    r = run_spec(random_spec(136000))
    _check(r)
    assert r.cls == "exact" or r.tie, r


def test_a_batch_of_single_pixels_dequantized_per_channel_is_exact() -> None:
    """Seed 140948 (Conv → GlobalAveragePool → Clip → Conv → Concat, batch 2): the Concat's
    per-channel dequantize is a binary over (2, 10, 1, 1) with a per-channel post-op, right
    on oneDNN's jit binary only with the operand in the dst's own strides. Giving every binary
    descriptor canonical size-1 strides (a guard tried for another oneDNN pitfall,
    docs/onednn.md) broke that: 43.6 LSB."""
    r = run_spec(random_spec(140948))
    _check(r)
    assert r.cls == "exact", r


def test_output_steps_read_the_producing_dequantize() -> None:
    spec = random_spec(0)
    model = quantized_model(spec)
    steps = output_steps(model)
    assert set(steps) == {o.name for o in model.graph.output}
    assert all(s is None or s > 0 for s in steps.values())


def test_minimize_shrinks_while_the_failure_persists() -> None:
    spec = Spec(9, [2, 6, 8, 8], [
        {"op": "Relu", "key": 0},
        {"op": "Conv", "key": 1, "out": 5, "k": [3, 3], "stride": [1, 1], "dil": [1, 1],
         "pads": [1, 1, 1, 1], "groups": "1", "bias": True},
        {"op": "Sigmoid", "key": 2}], {"kind": "hand", "per_channel": False, "weight": "s8",
                                        "coverage": 1.0})

    def fails_with_a_conv(s: Spec) -> Result:  # a stand-in failure: "any model with a Conv"
        ops = [n.op_type for n in quantized_model(s).graph.node]
        return Result(s.seed, "", "compile" if "Conv" in ops else "exact", message="conv")

    target = fails_with_a_conv(spec)
    small, result, tried = minimize(spec, target, run=fails_with_a_conv)
    assert result.cls == "compile" and 0 < tried <= 300
    assert [o["op"] for o in small.ops] == ["Conv"] and small.input_shape == [1, 1, 1, 1]
    assert small.ops[0]["out"] == 1 and small.ops[0]["bias"] is False


@pytest.mark.slow
def test_slow_campaign() -> None:
    failed = [r for r in (run_spec(random_spec(s)) for s in range(FAST_SEEDS, 1000))
              if r.failed]
    assert not failed, [(r.seed, r.cls, r.message or r.first) for r in failed[:10]]
