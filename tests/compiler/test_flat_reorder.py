"""compiler/lower/context.py ``flat_split``: a reorder element for element over gapless bytes
(a dequantize, a quantize, a copy) of a count with a prime factor above 256 and no divisor
in 64..1024 that is a multiple of 4 runs as two, a multiple of 256 and the rest: oneDNN 3.2's
jit reorder falls to a slow path on such counts (24929 = 97·257 elements 41 µs against
3.5 + 1.7). The same elements and arithmetic: bit-identical."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import qfuse
from qfuse.compiler.lower import context
from qfuse.ir.postops import ComposerOptions
from tests.compiler.onnx_builders import init, model

F32 = np.float32


def _dequantized(shape: tuple[int, ...]) -> object:
    """x → QuantizeLinear (u8, zero point 3) → y, and y's DequantizeLinear → z."""
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
    return model(nodes, {"x": (list(shape), TensorProto.FLOAT)}, ["y"],
                 [init("s", F32(0.05)), init("z", np.uint8(3))])


@pytest.mark.parametrize("shape", [(1, 97, 257), (3, 641, 17)])
def test_an_awkward_count_is_copied_in_rows_and_a_rest(shape: tuple[int, ...],
                                                       monkeypatch) -> None:
    m = _dequantized(shape)
    x = np.random.default_rng(0).normal(0, 3, shape).astype(F32)
    split = qfuse.compile_model(m)
    notes = [k.get("note", "") for k in split.inspect()["kernels"]]
    assert sum("oneDNN 3.2's jit reorder is slow" in n for n in notes) == 2, notes
    got = split.run({"x": x})["y"]
    monkeypatch.setattr(context, "FLAT_MIN", 1 << 40)
    whole = qfuse.compile_model(m)
    assert not [k for k in whole.inspect()["kernels"]
                if "jit reorder is slow" in k.get("note", "")]
    assert np.array_equal(got.view(np.uint32), whole.run({"x": x})["y"].view(np.uint32))
    want = (np.clip(np.rint(x / F32(0.05)) + 3, 0, 255) - 3).astype(F32) * F32(0.05)
    assert np.array_equal(got, want)


def test_a_count_with_a_block_divisor_no_large_prime_or_few_elements_stays_one_reorder(
        ) -> None:
    """Counts oneDNN's reorder copies at full speed: a multiple of 4 in 64..1024 divides
    them, or no prime factor passes 256 (21294 = 2·3²·7·13², 74793 = 3·107·233), or few."""
    for shape in ((1, 97, 264), (1, 7, 257), (4, 4655), (2, 10647), (3, 24931)):
        kernels = qfuse.compile_model(_dequantized(shape)).inspect()["kernels"]
        assert not [k for k in kernels if "jit reorder is slow" in k.get("note", "")], kernels


def test_both_parts_say_what_the_reorder_absorbed() -> None:
    """A requantize (Q → DQ → Q at another scale, one reorder) split in two: both parts carry
    the absorbed dequantize and the rounding the lowering records on the kernel it made."""
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
             helper.make_node("QuantizeLinear", ["d", "s2", "z"], ["q2"]),
             helper.make_node("DequantizeLinear", ["q2", "s2", "z"], ["y"])]
    m = model(nodes, {"x": ([1, 97, 257], TensorProto.FLOAT)}, ["y"],
              [init("s", F32(0.05)), init("s2", F32(0.07)), init("z", np.uint8(3))])
    # zero_point_before_round: the quantizes as reorders, the requantize one of them
    kernels = qfuse.compile_model(m, composer=ComposerOptions().with_(
        "zero_point_before_round")).inspect()["kernels"]
    parts = [k for k in kernels if "jit reorder is slow" in k.get("note", "")
             and k["node"] == "QuantizeLinear_2"]
    assert len(parts) == 2 and parts[0]["rounding"] == parts[1]["rounding"] != "", kernels
    assert parts[0]["absorbed"] == parts[1]["absorbed"] and len(parts[0]["absorbed"]) > 1
