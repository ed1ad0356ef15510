"""DepthToSpace (ONNX, both modes): imported as an IR op, moved past by a per-tensor
dequantize, lowered as one jit reorder between 6-D strided views; SpaceToDepth as ONNX defines
it (Reshape, Transpose, Reshape); bit-exact against onnxruntime in every mode, float and QDQ
(a permutation computes nothing)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from qfuse.compiler.api import compile_model
from qfuse.compiler.errors import MalformedModelError
from tests.compiler.onnx_builders import init, model, qdq_pair

F32 = np.float32


def _d2s(mode: str, quantized: bool, shape=(2, 12, 5, 7), blocksize: int = 2):
    nodes, inits, src = [], [], "x"
    if quantized:
        inits += [init("xs", F32(0.05)), init("xz", np.uint8(100)),
                  init("ys", F32(0.05)), init("yz", np.uint8(100))]
        nodes += qdq_pair("x", "x", "xd")
        src = "xd"
    nodes.append(helper.make_node("DepthToSpace", [src], ["d"], blocksize=blocksize,
                                  mode=mode))
    if quantized:
        nodes += qdq_pair("y", "d", "y")
    else:
        nodes.append(helper.make_node("Relu", ["d"], ["y"]))
    return model(nodes, {"x": (list(shape), TensorProto.FLOAT)}, ["y"], inits)


@pytest.mark.parametrize("quantized", [False, True])
@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_matches_onnxruntime_bit_for_bit(mode: str, quantized: bool) -> None:
    m = _d2s(mode, quantized)
    x = np.random.default_rng(0).normal(0, 2, (2, 12, 5, 7)).astype(F32)
    want = ort.InferenceSession(m.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    # fp32 mode strips the quantization: compared on the float model only
    for run_mode in ("fused", "unfused", "reference") + (() if quantized else ("fp32",)):
        compiled = compile_model(m, mode=run_mode)
        assert np.array_equal(compiled.run({"x": x})["y"], want), run_mode
    kernels = compile_model(m).inspect()["kernels"]
    moves = [k for k in kernels if "DepthToSpace" in k["name"]]
    assert moves and all(k["primitive"] == "reorder" and not k["impl"].startswith("ref")
                         for k in moves), kernels
    if quantized:  # the dequantize moved after it: the reorder moves u8 values
        assert {k["src_dtype"] for k in moves} == {"u8"}


def test_a_blocksize_that_does_not_divide_the_channels_is_named() -> None:
    with pytest.raises(MalformedModelError, match="blocksize 3 does not divide"):
        compile_model(_d2s("DCR", False, blocksize=3))


def _s2d(quantized: bool, shape=(2, 3, 8, 12), blocksize: int = 2):
    """SpaceToDepth (a YOLOX-style "Focus" stem): ``x → [Q/DQ] → SpaceToDepth → Relu``."""
    nodes, inits, src = [], [], "x"
    if quantized:
        inits += [init("xs", F32(0.05)), init("xz", np.uint8(100))]
        nodes += qdq_pair("x", "x", "xd")
        src = "xd"
    nodes += [helper.make_node("SpaceToDepth", [src], ["s"], blocksize=blocksize),
              helper.make_node("Relu", ["s"], ["y"])]
    return model(nodes, {"x": (list(shape), TensorProto.FLOAT)}, ["y"], inits)


@pytest.mark.parametrize("quantized", [False, True])
@pytest.mark.parametrize("blocksize", [2, 3])
def test_space_to_depth_is_one_reorder_bit_exact(blocksize: int, quantized: bool) -> None:
    """Imported as ONNX defines it (a Reshape, a Transpose, a Reshape: two views and one jit
    reorder, no island); bit-exact against onnxruntime in every mode."""
    shape = (2, 3, 6 * blocksize, 4 * blocksize)
    m = _s2d(quantized, shape, blocksize)
    x = np.random.default_rng(1).normal(0, 2, shape).astype(F32)
    want = ort.InferenceSession(m.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    for run_mode in ("fused", "unfused", "reference") + (() if quantized else ("fp32",)):
        compiled = compile_model(m, mode=run_mode)
        assert np.array_equal(compiled.run({"x": x})["y"], want), run_mode
    info = compile_model(m).inspect()
    moves = [k for k in info["kernels"] if k["name"].startswith("SpaceToDepth")]
    assert len(moves) == 1 and moves[0]["primitive"] == "reorder", info["kernels"]
    assert not moves[0]["impl"].startswith("ref") and info["numpy_kernels"] == 0
    if quantized:  # the dequantize moved after it: the reorder moves u8 values
        assert moves[0]["src_dtype"] == moves[0]["dst_dtype"] == "u8"


def test_a_blocksize_that_does_not_tile_the_image_is_named() -> None:
    with pytest.raises(MalformedModelError, match="blocksize 3 does not tile"):
        compile_model(_s2d(False, (1, 3, 8, 12), blocksize=3))
