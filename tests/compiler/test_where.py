"""Where: an IR op (it was an onnxruntime island), one numpy kernel that copies y, then x where
the condition holds (compiler/lower/lower_misc.py lower_where): bit-identical to the reference
(ONNX's select), equal to onnxruntime's values (which sums the two selected halves, so a
selected −0 comes out +0), a constant condition or branch taken once at compile time, ONNX's
broadcast."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from qfuse.compiler.api import compile_model
from tests.compiler.onnx_builders import init, model, run_ort

F32 = np.float32


def _causal_attention():
    """GPT-style masked scores: Where(mask == 0, −inf, s) → Softmax, the mask constant."""
    mask = np.tril(np.ones((1, 1, 16, 16), F32))
    nodes = [helper.make_node("Equal", ["mask", "zero"], ["masked"]),
             helper.make_node("Where", ["masked", "ninf", "s"], ["w"]),
             helper.make_node("Softmax", ["w"], ["p"], axis=-1)]
    return model(nodes, {"s": ((1, 2, 16, 16), TensorProto.FLOAT)}, ["w", "p"],
                 [init("mask", mask), init("zero", F32(0)), init("ninf", F32(-np.inf))])


def _runtime_condition():
    """Where(x > t, x, y·0.5) with the condition, x and y all computed at run time, y of
    another shape (broadcast)."""
    nodes = [helper.make_node("Greater", ["x", "t"], ["c"]),
             helper.make_node("Mul", ["y", "half"], ["yh"]),
             helper.make_node("Where", ["c", "x", "yh"], ["w"])]
    return model(nodes, {"x": ((2, 3, 5), TensorProto.FLOAT), "t": ((1, 5), TensorProto.FLOAT),
                         "y": ((3, 1), TensorProto.FLOAT)}, ["w"], [init("half", F32(0.5))])


@pytest.mark.parametrize("case", ["causal attention", "run-time condition"])
def test_where_is_one_numpy_kernel_bit_identical_to_onnxruntime(case: str) -> None:
    m = {"causal attention": _causal_attention, "run-time condition": _runtime_condition}[case]()
    compiled = compile_model(m)
    [where] = [k for k in compiled.inspect()["kernels"] if k["node"].startswith("Where")]
    assert where["primitive"] == "numpy", where
    reference = compile_model(m, mode="reference")
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim]
              for i in m.graph.input}
    for seed in range(3):
        rng = np.random.default_rng(seed)
        feeds = {n: rng.normal(0, 1, s).astype(F32) for n, s in shapes.items()}
        feeds[next(iter(feeds))].flat[:2] = -0.0  # copied with its sign
        want = dict(zip([o.name for o in m.graph.output], run_ort(m, feeds), strict=True))
        got = compiled.run(feeds)["w"]
        assert np.array_equal(got, want["w"])  # −0 == +0
        selected = reference.run(feeds)["w"]
        assert np.array_equal(got.view(np.uint32), selected.view(np.uint32))
