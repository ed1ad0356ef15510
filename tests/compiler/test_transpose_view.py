"""A Transpose whose input bytes already are its output's row-major layout (an int8 conv's
channels-last NCHW output permuted to NHWC, as ConvNeXt and tf2onnx models do) is a view: no
kernel copies it, and the values are the reference's."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper
from onnx_builders import init, model, qdq_pair, run_ort

from qfuse.compiler.api import compile_model
from qfuse.ir.postops import ComposerOptions

F = np.float32
# these tests look at the Transpose's own kernel; merge_copies (tests/compiler/
# test_merge_copies.py) then lets the dequantize after it read the source directly
NO_MERGE = ComposerOptions().without("merge_copies")


def _conv_then_transpose(perm: list[int]):
    rng = np.random.default_rng(0)
    nodes = [*qdq_pair("x", "x", "xd"),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"]),
             helper.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1]),
             *qdq_pair("c", "c", "cd"),
             helper.make_node("Transpose", ["cd"], ["t"], name="transpose", perm=perm),
             helper.make_node("Relu", ["t"], ["y"])]
    inits = [init("xs", np.array(0.02, F)), init("xz", np.array(128, np.uint8)),
             init("w", rng.integers(-60, 61, (16, 8, 3, 3)).astype(np.int8)),
             init("ws", np.array(0.01, F)), init("wz", np.array(0, np.int8)),
             init("cs", np.array(0.05, F)), init("cz", np.array(120, np.uint8))]
    return model(nodes, {"x": ((1, 8, 6, 7), TensorProto.FLOAT)}, ["y"], inits, opset=13)


def test_a_channels_last_tensor_permuted_to_nhwc_is_not_copied() -> None:
    m = _conv_then_transpose([0, 2, 3, 1])
    compiled = compile_model(m)
    kernels = compiled.inspect()["kernels"]
    assert not [k for k in kernels if k["node"] == "transpose"], kernels
    x = {"x": np.random.default_rng(1).uniform(-2, 2, (1, 8, 6, 7)).astype(F)}
    np.testing.assert_array_equal(compiled.run(x)["y"], run_ort(m, x)[0])


def test_another_permutation_is_copied() -> None:
    m = _conv_then_transpose([0, 3, 2, 1])
    compiled = compile_model(m, composer=NO_MERGE)
    assert [k for k in compiled.inspect()["kernels"] if k["node"] == "transpose"]
    merged = compile_model(m)  # the copy read through a view by the dequantize after it
    assert len(merged.inspect()["kernels"]) == len(compiled.inspect()["kernels"]) - 1
    x = {"x": np.random.default_rng(1).uniform(-2, 2, (1, 8, 6, 7)).astype(F)}
    for each in (compiled, merged):
        np.testing.assert_array_equal(each.run(x)["y"], run_ort(m, x)[0])


def _split_then_transpose(consumer_of_k: str = "Transpose"):
    """LeViT's attention: a quantized [1, N, h, 3·d] tensor (its qkv projection's output)
    split into q, k and v along the last axis, each transposed to [1, h, N, d] (k to
    [1, h, d, N])."""
    nodes = [*qdq_pair("x", "x", "xd"),
             helper.make_node("Reshape", ["xd", "shape"], ["r"]),
             helper.make_node("Split", ["r", "sizes"], ["q", "k", "v"], axis=3, name="split"),
             helper.make_node("Transpose", ["q"], ["qt"], perm=[0, 2, 1, 3], name="tq"),
             helper.make_node(consumer_of_k, ["k"], ["kt"], **(
                 {"perm": [0, 2, 3, 1]} if consumer_of_k == "Transpose" else {}), name="tk"),
             helper.make_node("Transpose", ["v"], ["vt"], perm=[0, 2, 1, 3], name="tv")]
    inits = [init("xs", np.array(0.02, F)), init("xz", np.array(128, np.uint8)),
             init("shape", np.array([1, 20, 4, 24], np.int64)),
             init("sizes", np.array([8, 8, 8], np.int64))]
    return model(nodes, {"x": ((1, 20, 96), TensorProto.FLOAT)}, ["qt", "kt", "vt"], inits,
                 opset=13)


def test_split_parts_read_only_by_transposes_are_not_copied_first() -> None:
    """Each part of the Split is a strided view read by one reorder (merge_copies: the part's
    copy, its Transpose's and the output's dequantize are one): three reorders, not nine; the
    values are onnxruntime's (data movement: exact)."""
    m = _split_then_transpose()
    compiled = compile_model(m)
    kernels = compiled.inspect()["kernels"]
    assert not [k for k in kernels if k["node"] == "split"], [k["name"] for k in kernels]
    assert len([k for k in kernels if k["primitive"] == "reorder"]) == 3
    unmerged = compile_model(m, composer=NO_MERGE).inspect()["kernels"]
    assert len([k for k in unmerged if k["primitive"] == "reorder"]) == 9
    x = {"x": np.random.default_rng(3).uniform(-2, 2, (1, 20, 96)).astype(F)}
    for got, want in zip((compiled.run(x)[n] for n in ("qt", "kt", "vt")), run_ort(m, x),
                         strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_split_part_read_by_another_op_is_copied() -> None:
    m = _split_then_transpose("Relu")
    compiled = compile_model(m, composer=NO_MERGE)
    assert [k for k in compiled.inspect()["kernels"] if k["node"] == "split"]
    x = {"x": np.random.default_rng(3).uniform(-2, 2, (1, 20, 96)).astype(F)}
    for got, want in zip((compiled.run(x)[n] for n in ("qt", "kt", "vt")), run_ort(m, x),
                         strict=True):
        np.testing.assert_array_equal(got, want)
