"""A Concat of inputs quantized with their own scales, types and zero points (DenseNet's dense
blocks as NNCF quantizes them: a ReLU's u8 output beside convolutions' s8 ones), read by a
float op (a pre-activation BatchNorm → ReLU → quantize): passes/propagate_dequantize.py makes
it an integer Concat with one per-channel dequantize, the s8 convolution writes u8 (q + 128)
itself, and the BatchNorm kernel reads the u8 Concat with per-channel (q - zp)·s post-ops
(passes/fuse_post_ops.py). Checked: the plan's kernels, and op by op against exact QDQ (onnxruntime).
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from qfuse import compile_model
from qfuse.compiler.op_check import check_op_by_op, format_text
from tests.compiler.onnx_builders import init, model, qdq_pair

RNG = np.random.default_rng(3)
F32 = np.float32


def _dense_block() -> tuple:
    c = 8
    nodes = (qdq_pair("x", "in", "ind")
             + qdq_pair("w1", "W1", "W1d") + qdq_pair("w2", "W2", "W2d")
             + qdq_pair("w3", "W3", "W3d")
             + [helper.make_node("Conv", ["ind", "W1d"], ["c1"], pads=[1, 1, 1, 1]),
                helper.make_node("Relu", ["c1"], ["r1"])]
             + qdq_pair("a", "r1", "ad")  # u8, zero point 0
             + [helper.make_node("Conv", ["ad", "W2d"], ["c2"], pads=[1, 1, 1, 1])]
             + qdq_pair("b", "c2", "bd")  # s8, zero point 0
             + [helper.make_node("Concat", ["ad", "bd"], ["cat"], axis=1),
                helper.make_node("Mul", ["cat", "gamma"], ["bn_m"]),
                helper.make_node("Add", ["bn_m", "beta"], ["bn"]),
                helper.make_node("Relu", ["bn"], ["bnr"])]
             + qdq_pair("n", "bnr", "nd")
             + [helper.make_node("Conv", ["nd", "W3d"], ["c3"])]
             + qdq_pair("o", "c3", "y"))
    inits = [init("xs", F32(0.05)), init("xz", np.uint8(128)),
             init("as", F32(0.04)), init("az", np.uint8(0)),
             init("bs", F32(0.07)), init("bz", np.int8(0)),
             init("ns", F32(0.03)), init("nz", np.uint8(0)),
             init("os", F32(0.02)), init("oz", np.uint8(120)),
             init("gamma", RNG.uniform(0.5, 1.5, (1, 2 * c, 1, 1)).astype(F32)),
             init("beta", RNG.uniform(-0.5, 0.5, (1, 2 * c, 1, 1)).astype(F32))]
    for name, shape in (("W1", (c, 3, 3, 3)), ("W2", (c, c, 3, 3)), ("W3", (4, 2 * c, 1, 1))):
        inits += [init(name, RNG.normal(0, 0.3, shape).astype(F32)),
                  init(f"{name.lower()}s", F32(0.01)), init(f"{name.lower()}z", np.int8(0))]
    m = model(nodes, {"in": ((1, 3, 12, 12), TensorProto.FLOAT)}, ["y"], inits, opset=13)
    return m, {"in": RNG.normal(0, 1, (1, 3, 12, 12)).astype(F32)}


def test_mixed_type_concat_runs_in_u8_exactly() -> None:
    m, feeds = _dense_block()
    fused = compile_model(m)
    kernels = {k["node"]: k for k in fused.inspect()["kernels"]}
    concat = next(k for k in kernels.values() if k["primitive"] == "concat")
    assert concat["src_dtype"] == "u8" and concat["dst_dtype"] == "u8", concat
    assert not any(k["src_dtype"] in ("u8", "s8") and k["dst_dtype"] == "f32"
                   and k["primitive"] == "reorder" for k in kernels.values())  # no dequantize
    bn = next(k for k in kernels.values() if k["op"] == "Mul")
    assert (bn["src_dtype"], bn["dst_dtype"]) == ("u8", "u8"), bn
    # input quantize and its layout, three convolutions, the Concat, the BatchNorm, the
    # output's layout (kernels per node: without VNNI a convolution's weights are split)
    assert len(kernels) <= 8, [k["name"] for k in kernels.values()]
    # each kernel fed exact QDQ's inputs (onnxruntime): the u8 Concat and the BatchNorm
    # kernel reading it give exact QDQ's integers; the convolutions are within one step
    check = check_op_by_op(m, feeds, compiled=fused)
    rows = {r.tensor: r for r in check.ints}
    assert all(rows[v].differing == 0 for v in ("cat_q", "nq")), format_text(check)
    assert check.max_lsb <= 1, format_text(check)
