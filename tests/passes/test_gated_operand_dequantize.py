"""A gated product ``act(f1(x))·f2(x)`` (StarNet's star blocks, gated MLPs): the chain of f1
takes the Mul with f2's dequantized output as its float32 operand (a binary post-op), so f2
writes those float32 values itself (fuse_post_ops ``run_view_dequantize`` without views,
``_float_operand``) instead of 8 bits and a dequantize reorder: one kernel less a gate, the
same values bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from qfuse.compiler.api import compile_model, random_inputs
from qfuse.passes import fuse_post_ops
from tests.compiler.onnx_builders import init, model

F32 = np.float32


def _qdq(name: str, src: str, dst: str, zero: int) -> list:
    return [helper.make_node("QuantizeLinear", [src, f"{name}_s", f"{name}_z"], [f"{name}_q"],
                             name=f"{name}_quantize"),
            helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"],
                             [dst], name=f"{name}_dequantize")]


def _star(matmul: bool, second_reader: str | None = None):
    """x → Q/DQ → f1, f2 (1x1 Conv or MatMul, 8 → 16 channels) → relu6(f1)·f2 → Q/DQ → y;
    ``second_reader``: f2's dequantized output also feeds "conv" (its source) or "out" (a
    graph output)."""
    rng = np.random.default_rng(11)
    shape = (1, 10, 8) if matmul else (1, 8, 12, 12)
    nodes = [*_qdq("x", "x", "xd", 128)]
    inits = [init("x_s", F32(0.03)), init("x_z", np.uint8(128))]
    for f in ("f1", "f2"):
        w = rng.integers(-127, 128, (8, 16) if matmul else (16, 8, 1, 1)).astype(np.int8)
        nodes.append(helper.make_node("DequantizeLinear", [f"{f}_w", f"{f}_ws"], [f"{f}_wd"],
                                      axis=1 if matmul else 0))
        if matmul:
            nodes += [helper.make_node("MatMul", ["xd", f"{f}_wd"], [f"{f}_mm"]),
                      helper.make_node("Add", [f"{f}_mm", f"{f}_b"], [f"{f}_o"])]
        else:
            nodes.append(helper.make_node("Conv", ["xd", f"{f}_wd", f"{f}_b"], [f"{f}_o"],
                                          name=f))
        inits += [init(f"{f}_w", w), init(f"{f}_ws", rng.uniform(0.01, 0.02, 16).astype(F32)),
                  init(f"{f}_b", rng.normal(0, 0.2, 16).astype(F32))]
    nodes += [helper.make_node("Clip", ["f1_o", "lo", "hi"], ["f1_r"]),
              *_qdq("a", "f1_r", "a_d", 0), *_qdq("g", "f2_o", "g_d", 121),
              helper.make_node("Mul", ["a_d", "g_d"], ["m"]), *_qdq("y", "m", "y", 118)]
    inits += [init("lo", F32(0)), init("hi", F32(6)),
              init("a_s", F32(6 / 255)), init("a_z", np.uint8(0)),
              init("g_s", F32(0.05)), init("g_z", np.uint8(121)),
              init("y_s", F32(0.09)), init("y_z", np.uint8(118))]
    outputs = ["y"]
    if second_reader == "out":
        outputs.append("g_d")
    elif second_reader == "conv":
        nodes.append(helper.make_node("DequantizeLinear", ["c_w", "c_ws"], ["c_wd"], axis=0))
        nodes.append(helper.make_node("Conv", ["g_d", "c_wd"], ["c"], name="reader"))
        nodes += _qdq("c", "c", "c_out", 0)
        inits += [init("c_w", rng.integers(-127, 128, (4, 16, 1, 1)).astype(np.int8)),
                  init("c_ws", np.full(4, 0.01, F32)), init("c_s", F32(0.2)),
                  init("c_z", np.uint8(0))]
        outputs.append("c_out")
    return model(nodes, {"x": (shape, TensorProto.FLOAT)}, outputs, inits, opset=13)


def _both(m, monkeypatch: pytest.MonkeyPatch):
    folded = compile_model(m)
    with monkeypatch.context() as patch:
        patch.setattr(fuse_post_ops, "_float_operand", lambda *args: False)
        kept = compile_model(m)
    return folded, kept


def _same(a, b, seeds: int = 3) -> None:
    for seed in range(seeds):
        feeds = random_inputs(a, seed=seed)
        got, want = a.run(feeds), b.run(feeds)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])


@pytest.mark.parametrize("matmul", [False, True], ids=["conv", "matmul"])
def test_second_factor_written_in_float32_by_its_producer(
        matmul: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    m = _star(matmul)
    folded, kept = _both(m, monkeypatch)
    kernels = folded.inspect()["kernels"]
    assert len(kernels) == len(kept.inspect()["kernels"]) - 1
    [f2] = [k for k in kernels if "g_dequantize" in k["absorbed"]]
    assert f2["primitive"] in ("convolution", "matmul") and f2["dst_dtype"] == "f32"
    assert f2["post_ops"][-1] == "eltwise_linear"  # the dequantize's exact multiply
    [standalone] = [k for k in kept.inspect()["kernels"] if "g_dequantize" in k["absorbed"]]
    assert standalone["op"] == "DequantizeLinear"
    _same(folded, kept)


@pytest.mark.parametrize("reader", ["conv", "out"])
def test_kept_where_the_8_bits_are_read_too(reader: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A convolution reading f2's dequantized output takes its 8 bits, a graph output is the
    dequantized value: the dequantize stays a kernel."""
    folded, kept = _both(_star(False, reader), monkeypatch)
    assert len(folded.inspect()["kernels"]) == len(kept.inspect()["kernels"])
    _same(folded, kept)
