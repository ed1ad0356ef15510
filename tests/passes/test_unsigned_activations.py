"""s8 activations written as u8 with zero point + 128 where oneDNN's int8 kernels have no VNNI
(passes/decompose_fake_quantize.py, ``PassContext.unsigned_activations``, composer option
``unsigned_activations``): bit-exact against the plan without it, one shift reorder less per
s8 tensor a convolution reads; tensors read as a matmul's second operand or written by a
LayerNorm stay s8."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from qfuse.compiler.api import compile_model, import_graph, random_inputs
from qfuse.compiler.lower.no_vnni import SHIFT, isa_is_exact
from qfuse.compiler.pipeline import run_pipeline
from qfuse.ir import DType, Op
from qfuse.ir.postops import ComposerOptions
from qfuse.passes.base import PassContext
from tests.compiler.onnx_builders import init, model, qdq_pair

OFF = ComposerOptions().without("unsigned_activations")


def _conv(i: int, src: str, dst: str, rng: np.random.Generator) -> tuple[list, list]:
    w = rng.integers(-127, 128, size=(8, 8, 3, 3)).astype(np.int8)  # split without VNNI
    inits = [init(f"w{i}", w), init(f"w{i}s", rng.uniform(0.002, 0.01, 8).astype(np.float32)),
             init(f"w{i}z", np.zeros(8, np.int8)),
             init(f"b{i}", rng.normal(0, 0.2, 8).astype(np.float32))]
    nodes = [helper.make_node("DequantizeLinear", [f"w{i}", f"w{i}s", f"w{i}z"], [f"w{i}d"],
                              axis=0),
             helper.make_node("Conv", [src, f"w{i}d", f"b{i}"], [dst], pads=[1, 1, 1, 1])]
    return nodes, inits


def _nncf_like() -> onnx.ModelProto:
    """NNCF's symmetric form: s8 activations, zero point 0, a SiLU and a residual Add:
    x → Q/DQ → conv → SiLU → Q/DQ → a; conv(a) + a → Q/DQ → y."""
    rng = np.random.default_rng(2)
    c1, i1 = _conv(1, "xd", "c1", rng)
    c2, i2 = _conv(2, "ad", "c2", rng)
    inits = [*i1, *i2, init("xs", np.float32(0.03)), init("xz", np.int8(0)),
             init("as", np.float32(0.05)), init("az", np.int8(0)),
             init("ys", np.float32(0.07)), init("yz", np.int8(0))]
    nodes = [*qdq_pair("x", "x", "xd"), *c1, helper.make_node("Sigmoid", ["c1"], ["sg"]),
             helper.make_node("Mul", ["c1", "sg"], ["a"]), *qdq_pair("a", "a", "ad"), *c2,
             helper.make_node("Add", ["c2", "ad"], ["r"]), *qdq_pair("y", "r", "y")]
    return model(nodes, {"x": ([1, 8, 12, 12], TensorProto.FLOAT)}, ["y"], inits)


def _shift_reorders(compiled: object) -> int:
    return sum(k.kind == "reorder" and SHIFT in (k.info.note or "")
               for k in compiled.plan.kernels)  # type: ignore[attr-defined]


def test_bit_exact_and_no_shift_reorder() -> None:
    m = _nncf_like()
    on, off = compile_model(m), compile_model(m, composer=OFF)
    for seed in range(4):
        feeds = random_inputs(on, seed=seed)
        feeds["x"] *= 4  # saturate both ends of every quantize
        assert np.array_equal(on.run(feeds)["y"].view(np.uint32),
                              off.run(feeds)["y"].view(np.uint32))
    assert _shift_reorders(on) == 0
    if isa_is_exact():  # VNNI / AMX: s8 sources are exact, nothing changes
        assert len(on.plan.kernels) == len(off.plan.kernels)
    else:
        # two shift reorders gone; the residual a, read by its convolution and summed into
        # that convolution's dst, is now copied there (the shifted copy left a free before)
        assert _shift_reorders(off) == 2
        assert len(on.plan.kernels) == len(off.plan.kernels) - 1


def _types_after_decompose(m: onnx.ModelProto) -> dict[str, DType]:
    graph = import_graph(m)
    run_pipeline(graph, PassContext(unsigned_activations=True), until="decompose_fake_quantize")
    return {n.inputs[0]: graph.info(n.outputs[0]).dtype for n in graph.topo_order()
            if n.op is Op.FAKE_QUANTIZE}


def test_types_with_the_option() -> None:
    types = _types_after_decompose(_nncf_like())
    assert types == {"x": DType.U8, "a": DType.U8, "r": DType.U8}


@pytest.mark.parametrize("case", ["matmul_weights", "layer_norm"])
def test_tensors_whose_rounding_could_move_stay_signed(case: str) -> None:
    """A matmul's second operand (oneDNN takes s8 weights) and a LayerNorm's output (its int8
    store adds the zero point before rounding) keep s8; the other tensors turn u8."""
    inits = [init("as", np.float32(0.05)), init("az", np.int8(0)),
             init("bs", np.float32(0.04)), init("bz", np.int8(0)),
             init("ys", np.float32(0.1)), init("yz", np.int8(0))]
    if case == "matmul_weights":
        nodes = [*qdq_pair("a", "x", "ad"), *qdq_pair("b", "w", "bd"),
                 helper.make_node("MatMul", ["ad", "bd"], ["m"]), *qdq_pair("y", "m", "y")]
        inputs = {"x": ([1, 4, 6], TensorProto.FLOAT), "w": ([1, 6, 5], TensorProto.FLOAT)}
        signed = {"w"}
    else:
        inits += [init("g", np.ones(6, np.float32)), init("beta", np.zeros(6, np.float32))]
        nodes = [*qdq_pair("a", "x", "ad"),
                 helper.make_node("LayerNormalization", ["ad", "g", "beta"], ["n"], axis=-1),
                 *qdq_pair("y", "n", "y")]
        inputs = {"x": ([1, 4, 6], TensorProto.FLOAT)}
        signed = {"n", "x"}  # the LayerNorm writes n and reads x
    types = _types_after_decompose(model(nodes, inputs, ["y"], inits))
    assert {t for t, d in types.items() if d is DType.S8} == signed
    assert all(d is DType.U8 for t, d in types.items() if t not in signed)
