"""Comparisons and logical ops (Equal, Less, Greater, LessOrEqual, GreaterOrEqual, And, Or,
Xor, Not): one IR op, Logic, run as numpy kernels (bool values have no oneDNN type); they were
onnxruntime islands. The same bools as onnxruntime, broadcast as ONNX broadcasts."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from qfuse.compiler.api import compile_model
from qfuse.compiler.onnx_import import import_model
from qfuse.ir import Op
from tests.compiler.onnx_builders import model, run_ort


@pytest.mark.parametrize("op", ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
@pytest.mark.parametrize("dtype", [TensorProto.INT64, TensorProto.FLOAT])
def test_a_comparison_is_a_logic_kernel(op: str, dtype: int) -> None:
    """``mask == 0`` of an int64 attention mask, or a float comparison; then Where selects."""
    nodes = [helper.make_node(op, ["a", "b"], ["c"]),
             helper.make_node("Not", ["c"], ["n"]),
             helper.make_node("Xor", ["c", "n"], ["x"]),
             helper.make_node("And", ["x", "c"], ["y"]),
             helper.make_node("Or", ["y", "n"], ["z"])]
    m = model(nodes, {"a": ((2, 1, 6), dtype), "b": ((1, 6), dtype)}, ["c", "n", "y", "z"])
    assert {n.op for n in import_model(m)} == {Op.LOGIC}
    compiled = compile_model(m)
    assert {k["primitive"] for k in compiled.inspect()["kernels"]} == {"numpy"}
    rng = np.random.default_rng(0)
    np_type = np.int64 if dtype == TensorProto.INT64 else np.float32
    feeds = {"a": rng.integers(0, 3, (2, 1, 6)).astype(np_type),
             "b": rng.integers(0, 3, (1, 6)).astype(np_type)}
    got = compiled.run(feeds)
    for name, want in zip(["c", "n", "y", "z"], run_ort(m, feeds), strict=True):
        assert got[name].dtype == np.bool_ and np.array_equal(got[name], want), name
