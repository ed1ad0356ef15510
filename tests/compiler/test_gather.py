"""Gather with run-time (or scattered constant) indices: an IR op (it was an onnxruntime
island), one numpy kernel taking the rows (compiler/lower/lower_misc.py lower_gather):
bit-identical to onnxruntime, negative indices counting from the end, an index out of range
an InputError naming the node."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from qfuse.compiler.api import compile_model
from qfuse.ir.errors import InputError
from tests.compiler.onnx_builders import init, model, run_ort

F32 = np.float32


def _embedding(axis: int = 0, indices: np.ndarray | None = None):
    """An embedding table [50, 16] (constant) indexed by token ids (an int64 input, or the
    constant ``indices``), then a Relu."""
    rng = np.random.default_rng(0)
    table = rng.normal(0, 1, (50, 16) if axis == 0 else (16, 50)).astype(F32)
    inits = [init("table", table)]
    inputs = {}
    if indices is None:
        inputs["ids"] = ((2, 7), TensorProto.INT64)
    else:
        inits.append(init("ids", indices))
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], axis=axis),
             helper.make_node("Relu", ["e"], ["y"])]
    if not inputs:  # a graph input for the Relu's sake: the table plus a run-time value
        nodes = [helper.make_node("Add", ["table", "x"], ["t"]),
                 helper.make_node("Gather", ["t", "ids"], ["e"], axis=axis),
                 helper.make_node("Relu", ["e"], ["y"])]
        inputs["x"] = ((1, 1), TensorProto.FLOAT)
    return model(nodes, inputs, ["y"], inits)


@pytest.mark.parametrize("axis", [0, 1])
def test_run_time_indices_are_one_numpy_kernel_bit_identical(axis: int) -> None:
    m = _embedding(axis)
    compiled = compile_model(m)
    [gather] = [k for k in compiled.inspect()["kernels"] if k["node"].startswith("Gather")]
    assert gather["primitive"] == "numpy" and "numpy take" in gather["note"], gather
    for seed in range(3):
        ids = np.random.default_rng(seed).integers(-50, 50, (2, 7)).astype(np.int64)
        got = compiled.run({"ids": ids})["y"]
        want = run_ort(m, {"ids": ids})[0]
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_scattered_constant_indices_are_a_gather_node() -> None:
    """More runs of consecutive indices than a Concat of Slices takes (MAX_GATHER_RUNS)."""
    indices = np.array([9, 2, 40, 7, 33, 1, 18, 25, 4, 47, 12, 30, 0, 44, 21, 3, 38, 15],
                       np.int64)
    m = _embedding(0, indices)
    compiled = compile_model(m)
    assert any(k["node"].startswith("Gather") and k["primitive"] == "numpy"
               for k in compiled.inspect()["kernels"])
    x = {"x": np.full((1, 1), 0.25, F32)}
    assert np.array_equal(compiled.run(x)["y"], run_ort(m, x)[0])


def test_an_index_out_of_range_names_the_node() -> None:
    compiled = compile_model(_embedding(0))
    with pytest.raises(InputError, match=r"Gather.*out of range for axis 0 of size 50"):
        compiled.run({"ids": np.full((2, 7), 50, np.int64)})
