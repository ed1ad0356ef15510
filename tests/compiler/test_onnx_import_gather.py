"""Gather with constant indices: one index, or a run of consecutive ones, is a Slice (plus a
Squeeze for a scalar index, a Reshape for indices of rank > 1), exact in every mode; other
indices, and run-time ones, are a Gather node (tests/compiler/test_gather.py)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx_builders import init, model, qdq_pair, run_ort, single

from qfuse.compiler.api import compile_model
from qfuse.compiler.errors import MalformedModelError
from qfuse.compiler.onnx_import import import_model
from qfuse.ir import Op

F = np.float32
SHAPE = (3, 2, 5, 4)


def _feeds(shape: tuple[int, ...] = SHAPE) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(0).standard_normal(shape).astype(F)}


@pytest.mark.parametrize(("indices", "axis"), [
    (np.array(0, np.int64), 0),      # qkv[0]: a scalar index drops the axis
    (np.array(-1, np.int64), 2),     # negative, from the end
    (np.array(1, np.int32), -3),     # int32 indices, negative axis
    (np.array([2], np.int64), 2),    # one index, axis kept
    (np.array([1, 2, 3], np.int64), 2),  # a run
    (np.array([-2, -1], np.int64), 3),   # a run written from the end
    (np.array([[0, 1]], np.int64), 2),   # indices of rank 2: the run reshaped
    (np.arange(4, dtype=np.int64).reshape(1, 4, 1, 1), 3),  # torch.export's as_strided
])
def test_a_run_of_indices_is_a_slice_and_equal_to_onnxruntime(indices: np.ndarray,
                                                               axis: int) -> None:
    m = single("Gather", SHAPE, [init("i", indices)], axis=axis)
    ops = [n.op for n in import_model(m)]
    assert Op.ISLAND not in ops and Op.SLICE in ops
    assert (Op.SQUEEZE in ops) == (indices.ndim == 0)
    assert (Op.RESHAPE in ops) == (indices.ndim > 1)
    want = run_ort(m, _feeds())[0]
    for mode in ("reference", "fused", "unfused"):
        got = compile_model(m, mode=mode).run(_feeds())
        np.testing.assert_array_equal(next(iter(got.values())), want)


@pytest.mark.parametrize(("indices", "axis", "runs"), [
    (np.array([2, 1, 0], np.int64), 1, 3),   # RGB → BGR, out of range for axis 1 of SHAPE
    (np.array([2, 1], np.int64), 2, 2),      # reversed
    (np.array([0, 0], np.int64), 2, 2),      # repeated
    (np.array([2, 3, 0, 1], np.int64), 2, 2),  # blocks swapped (a Focus stem's order)
    (np.array([-1, 0, 1], np.int64), 3, 2),  # from the end, then a run
])
def test_indices_in_a_few_runs_are_a_concat_of_slices(indices: np.ndarray, axis: int,
                                                      runs: int) -> None:
    """A Gather of constant 1-D indices out of order: one Slice per run of consecutive
    indices and a Concat, no island; bit-exact with onnxruntime in every mode."""
    if axis == 1 and indices.max() >= SHAPE[1]:
        shape = (SHAPE[0], 3, *SHAPE[2:])
    else:
        shape = SHAPE
    m = single("Gather", shape, [init("i", indices)], axis=axis)
    ops = [n.op for n in import_model(m)]
    assert Op.ISLAND not in ops and ops.count(Op.SLICE) == runs and Op.CONCAT in ops, ops
    want = run_ort(m, _feeds(shape))[0]
    for mode in ("reference", "fused", "unfused"):
        got = compile_model(m, mode=mode).run(_feeds(shape))
        np.testing.assert_array_equal(next(iter(got.values())), want)


def test_other_constant_indices_are_a_gather_node() -> None:
    """Indices neither consecutive nor in few runs (rank 2 out of order; 20 runs of one index)
    are a Gather node (a numpy kernel), no island; bit-exact with onnxruntime in every mode."""
    shape = (1, 40, 2, 2)
    for m, feeds in ((single("Gather", SHAPE, [init("i", np.array([[1, 0]], np.int64))],
                             axis=2), _feeds()),
                     (single("Gather", shape, [init("i", np.arange(39, 19, -1))], axis=1),
                      _feeds(shape))):
        ops = [n.op for n in import_model(m)]
        assert Op.GATHER in ops and Op.ISLAND not in ops, ops
        want = run_ort(m, feeds)[0]
        for mode in ("reference", "fused", "unfused"):
            got = compile_model(m, mode=mode).run(feeds)
            np.testing.assert_array_equal(next(iter(got.values())), want)


def test_run_time_indices_are_a_gather_node() -> None:
    node = helper.make_node("Gather", ["x", "i"], ["y"], name="n", axis=1)
    m = model([node], {"x": (SHAPE, TensorProto.FLOAT), "i": ((), TensorProto.INT64)}, ["y"])
    assert [n.op for n in import_model(m)] == [Op.GATHER]
    feeds = {**_feeds(), "i": np.array(-1, np.int64)}
    want = run_ort(m, feeds)[0]
    for mode in ("reference", "fused", "unfused"):
        np.testing.assert_array_equal(compile_model(m, mode=mode).run(feeds)["y"], want)


def test_an_index_out_of_range_is_refused_naming_the_node() -> None:
    m = single("Gather", SHAPE, [init("i", np.array(5, np.int64))], axis=1)
    with pytest.raises(MalformedModelError, match=r"node 'n'.*out of range"):
        import_model(m)


def test_an_int8_tensor_is_gathered_in_int8() -> None:
    """DQ → Gather → Q (attention's q, k, v picked out of one quantized projection): the
    Slice picks int8 values (only the graph output is dequantized), bit-exact; index 1 of
    axis 0 is one contiguous run, so the Slice is a view, no kernel of its own."""
    nodes = [*qdq_pair("a", "x", "xd"),
             helper.make_node("Gather", ["xd", "i"], ["g"], axis=0),
             *qdq_pair("b", "g", "y")]
    inits = [init("as", np.array(0.02, F)), init("az", np.array(128, np.uint8)),
             init("bs", np.array(0.02, F)), init("bz", np.array(128, np.uint8)),
             init("i", np.array(1, np.int64))]
    m = model(nodes, {"x": (SHAPE, TensorProto.FLOAT)}, ["y"], inits, opset=13)
    compiled = compile_model(m)
    kernels = compiled.inspect()["kernels"]
    assert not [k for k in kernels if k["node"] and "Gather" in k["node"]], kernels
    assert [(k["src_dtype"], k["dst_dtype"]) for k in kernels
            if k["primitive"] == "reorder"] == [("u8", "f32")], kernels  # the output's DQ
    np.testing.assert_array_equal(compiled.run(_feeds())["y"], run_ort(m, _feeds())[0])
