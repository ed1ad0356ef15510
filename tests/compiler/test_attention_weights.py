"""Attention's K as int8 MatMul weights when a quantized k·(1/√d) produces it (DeiT, PiT,
TinyViT, MobileViT QDQ): the Mul's kernel writes s8 with zero point − 128
(passes/signed_matmul_weights.py), so no reorder shifts K from u8 before the MatMul."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx_builders import init, model, qdq_pair, run_ort

from qfuse.compiler.api import compile_model
from qfuse.passes import fuse_post_ops
from tests.compiler.lower_helpers import one_primitive_per_int8_node

F = np.float32


def _scaled_keys():
    """q, k: [1, 2, 16, 8] quantized; k·0.35 quantized, transposed, then q·kᵀ quantized."""
    nodes = [*qdq_pair("q", "q", "qd"), *qdq_pair("k", "k", "kd"),
             helper.make_node("Mul", ["kd", "c"], ["km"]), *qdq_pair("km", "km", "kmd"),
             helper.make_node("Transpose", ["kmd"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["qd", "kt"], ["s"]), *qdq_pair("s", "s", "y")]
    inits = [init("qs", np.array(0.03, F)), init("qz", np.array(128, np.uint8)),
             init("ks", np.array(0.02, F)), init("kz", np.array(120, np.uint8)),
             init("c", np.array(0.35, F)),
             init("kms", np.array(0.01, F)), init("kmz", np.array(131, np.uint8)),
             init("ss", np.array(0.05, F)), init("sz", np.array(125, np.uint8))]
    return model(nodes, {"q": ((1, 2, 16, 8), TensorProto.FLOAT),
                         "k": ((1, 2, 16, 8), TensorProto.FLOAT)}, ["y"], inits, opset=13)


def test_scaled_keys_are_written_as_s8() -> None:
    m = _scaled_keys()
    compiled = compile_model(m)
    kernels = compiled.inspect()["kernels"]
    assert not [k for k in kernels if "shifted to s8" in k.get("note", "")], \
        [k["name"] for k in kernels]
    rng = np.random.default_rng(5)
    feeds = {n: rng.uniform(-2, 2, (1, 2, 16, 8)).astype(F) for n in ("q", "k")}
    got = compiled.run(feeds)["y"]
    want = run_ort(m, feeds, optimized=False)[0]
    # onnxruntime multiplies in float32, the int8 matmul sums integers: near-ties part
    steps = np.abs(got - want) / 0.05
    assert steps.max() <= 1 + 1e-4 and np.mean(steps < 1e-4) > 0.99
    np.testing.assert_array_equal(got, compile_model(m, mode="unfused").run(feeds)["y"])


def _heads_merged(silu: bool = False):
    """P·V [1, 2, 16, 8] quantized, transposed to [1, 16, 2, 8] and reshaped to [1, 16, 16]
    for the output projection: the heads merged as every ViT does. ``silu``: then
    dequantized for a SiLU x·sigmoid(x), quantized (LeViT's attention output before its
    Hardswish): every reader of the dequantized value computes in float32."""
    merged = "m" if silu else "y"
    nodes = [*qdq_pair("p", "p", "pd"), *qdq_pair("v", "v", "vd"),
             helper.make_node("MatMul", ["pd", "vd"], ["o"]), *qdq_pair("o", "o", "od"),
             helper.make_node("Transpose", ["od"], ["ot"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["ot", "shape"], [merged])]
    inits = [init("ps", np.array(1 / 255, F)), init("pz", np.array(0, np.uint8)),
             init("vs", np.array(0.02, F)), init("vz", np.array(120, np.uint8)),
             init("os", np.array(0.03, F)), init("oz", np.array(128, np.uint8)),
             init("shape", np.array([1, 16, 16], np.int64))]
    if silu:
        nodes += [helper.make_node("Sigmoid", ["m"], ["g"]),
                  helper.make_node("Mul", ["m", "g"], ["s"]), *qdq_pair("s", "s", "y")]
        inits += [init("ss", np.array(0.02, F)), init("sz", np.array(20, np.uint8))]
    return model(nodes, {"p": ((1, 2, 16, 16), TensorProto.FLOAT),
                         "v": ((1, 2, 16, 8), TensorProto.FLOAT)}, ["y"], inits, opset=13)


@one_primitive_per_int8_node
def test_heads_are_merged_by_the_matmul_store() -> None:
    """The matmul writes [B, h, N, d] in the strides of [B, N, h, d] (lower_matmul
    ``_transposed_dst``): the Transpose is a view, no reorder copies it; same values."""
    m = _heads_merged()
    compiled = compile_model(m)
    kernels = compiled.inspect()["kernels"]
    assert [k["primitive"] for k in kernels if k["op"] in ("MatMul", "Transpose")] == ["matmul"]
    (mm,) = [k for k in kernels if k["op"] == "MatMul"]
    assert mm["dst_layouts"] == ["u8 (1, 2, 16, 8) strides=(256, 8, 16, 1)"]
    rng = np.random.default_rng(6)
    feeds = {"p": rng.uniform(0, 1, (1, 2, 16, 16)).astype(F),
             "v": rng.uniform(-2, 2, (1, 2, 16, 8)).astype(F)}
    got = compiled.run(feeds)["y"]
    np.testing.assert_array_equal(got, compile_model(m, mode="unfused").run(feeds)["y"])
    steps = np.abs(got - run_ort(m, feeds, optimized=False)[0]) / 0.03
    assert steps.max() <= 1 + 1e-4


def _biased_scores(batch: int):
    """q·kᵀ quantized, dequantized, plus a position bias [2, 16, 16] (a DequantizeLinear of
    int8 constants, as LeViT's gathered table), quantized, then Softmax: LeViT, and Swin's
    windows (``batch`` > 1: the bias broadcasts along them)."""
    rng = np.random.default_rng(7)
    nodes = [*qdq_pair("q", "q", "qd"), *qdq_pair("k", "k", "kd"),
             helper.make_node("Transpose", ["kd"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["qd", "kt"], ["s"]), *qdq_pair("s", "s", "sd"),
             helper.make_node("DequantizeLinear", ["bq", "bs"], ["b"]),
             helper.make_node("Add", ["sd", "b"], ["a"]), *qdq_pair("a", "a", "ad"),
             helper.make_node("Softmax", ["ad"], ["p"], axis=-1), *qdq_pair("p", "p", "y")]
    inits = [init("qs", np.array(0.03, F)), init("qz", np.array(128, np.uint8)),
             init("ks", np.array(0.02, F)), init("kz", np.array(120, np.uint8)),
             init("ss", np.array(0.05, F)), init("sz", np.array(125, np.uint8)),
             init("bq", rng.integers(-127, 128, (2, 16, 16)).astype(np.int8)),
             init("bs", np.array(0.02, F)),
             init("as", np.array(0.06, F)), init("az", np.array(120, np.uint8)),
             init("ps", np.array(1 / 255, F)), init("pz", np.array(0, np.uint8))]
    shape = (batch, 2, 16, 8)
    return model(nodes, {"q": (shape, TensorProto.FLOAT), "k": (shape, TensorProto.FLOAT)},
                 ["y"], inits, opset=13)


@pytest.mark.parametrize("batch", [1, 3])
def test_position_bias_is_a_post_op_of_the_scores(batch: int, monkeypatch) -> None:
    """The constant bias varies along the heads and both token dims, not along the channels:
    the scores' matmul adds it as a binary post-op of the chain's full shape
    (fuse_post_ops ``_whole_constant``), so no dequantize reorder and no binary kernel stand
    between the matmul and the Softmax; the same values as without."""
    m = _biased_scores(batch)
    rng = np.random.default_rng(8)
    feeds = {n: rng.uniform(-2, 2, (batch, 2, 16, 8)).astype(F) for n in ("q", "k")}
    compiled = compile_model(m)
    kinds = [k["primitive"] for k in compiled.inspect()["kernels"]]
    assert "binary" not in kinds[kinds.index("matmul"):], kinds
    assert not [k for k in compiled.inspect()["kernels"] if k["impl"].startswith("ref")]
    monkeypatch.setattr(fuse_post_ops, "_whole_constant", lambda *args: None)
    before = compile_model(m)
    # + the dequantize reorder and the binary kernel; without VNNI the scores' float32
    # matmul (lower_matmul) then also stores its 8-bit output by a reorder
    stores = [k for k in before.inspect()["kernels"] if "rint, saturation" in k.get("note", "")]
    assert len(before.inspect()["kernels"]) == len(kinds) + 2 + len(stores)
    np.testing.assert_array_equal(compiled.run(feeds)["y"], before.run(feeds)["y"])


@one_primitive_per_int8_node
def test_dequantize_after_merged_heads_is_written_by_the_matmul(monkeypatch) -> None:
    """The matmul's chain ends in the dequantize (fuse_post_ops ``run_view_dequantize``):
    it writes the float32 values, in the merged heads' order, and no reorder dequantizes
    them; the same values as the plan with the dequantize kernel."""
    m = _heads_merged(silu=True)
    rng = np.random.default_rng(9)
    feeds = {"p": rng.uniform(0, 1, (1, 2, 16, 16)).astype(F),
             "v": rng.uniform(-2, 2, (1, 2, 16, 8)).astype(F)}
    compiled = compile_model(m)
    kernels = compiled.inspect()["kernels"]
    (mm,) = [k for k in kernels if k["op"] == "MatMul"]
    assert mm["dst_dtype"] == "f32" and mm["dst_layouts"] == [
        "f32 (1, 2, 16, 8) strides=(256, 8, 16, 1)"]
    assert [k["primitive"] for k in kernels[kernels.index(mm):]] == ["matmul", "binary"]
    monkeypatch.setattr(fuse_post_ops, "_view_dequantize", lambda *args: None)
    before = compile_model(m)
    assert len(before.inspect()["kernels"]) == len(kernels) + 1
    np.testing.assert_array_equal(compiled.run(feeds)["y"], before.run(feeds)["y"])
