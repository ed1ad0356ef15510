"""Decomposed LayerNorm and erf-GELU as PyTorch and Paddle export them become one
LayerNormalization / Gelu node, with and without Q/DQ around them, and compute what
onnxruntime computes on the decomposed graph."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx_builders import init, model, run_ort

from qfuse.compiler.api import compile_model
from qfuse.compiler.onnx_import import import_model
from qfuse.ir import Op

F = np.float32
FLOAT = TensorProto.FLOAT


def gelu_erf(variant: str) -> list:
    """0.5·x·(1 + erf(x/√2)) → g: PyTorch Div(x, √2) and Mul(Mul(x, a), 0.5); Paddle
    Mul(x, 1/√2) and Mul(a, Mul(0.5, x))."""
    scale = 1.4142135381698608 if variant == "div" else 0.7071067690849304
    consts = [helper.make_node("Constant", [], [name], value=helper.make_tensor(
        name, FLOAT, [], [value])) for name, value in (("c", scale), ("one", 1.0),
                                                        ("half", 0.5))]
    op = "Div" if variant == "div" else "Mul"
    nodes = [helper.make_node(op, ["x", "c"], ["u"]), helper.make_node("Erf", ["u"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["a"])]
    if variant == "div":
        nodes += [helper.make_node("Mul", ["x", "a"], ["xa"]),
                  helper.make_node("Mul", ["xa", "half"], ["g"])]
    else:
        nodes += [helper.make_node("Mul", ["half", "x"], ["hx"]),
                  helper.make_node("Mul", ["a", "hx"], ["g"])]
    return consts + nodes


def layer_norm_nodes(opset: int, square: str, inverse: str, affine: bool, x: str = "x",
                     y: str = "y") -> list:
    """(x - mean) / sqrt(var + eps) [· g + b] over the last axis: PyTorch writes Pow and Div
    (before opset 17), Paddle Mul(d, d) / Pow and Div or Reciprocal + Mul."""
    axes = {"axes": [-1]} if opset < 18 else {}

    def reads(value: str) -> list[str]:
        return [value] if opset < 18 else [value, "axes"]

    nodes = [helper.make_node("ReduceMean", reads(x), ["mean"], **axes),
             helper.make_node("Sub", [x, "mean"], ["d"])]
    nodes.append(helper.make_node("Pow", ["d", "two"], ["p"]) if square == "pow" else
                 helper.make_node("Mul", ["d", "d"], ["p"]))
    nodes += [helper.make_node("ReduceMean", reads("p"), ["var"], **axes),
              helper.make_node("Add", ["var", "eps"], ["ve"]),
              helper.make_node("Sqrt", ["ve"], ["s"])]
    last = "n" if affine else y
    if inverse == "div":
        nodes.append(helper.make_node("Div", ["d", "s"], [last]))
    else:
        nodes += [helper.make_node("Reciprocal", ["s"], ["r"]),
                  helper.make_node("Mul", ["d", "r"], [last])]
    if affine:
        nodes += [helper.make_node("Mul", ["n", "g"], ["gn"]),
                  helper.make_node("Add", ["b", "gn"], [y])]
    return nodes


def layer_norm_inits(opset: int, c: int) -> list:
    rng = np.random.default_rng(c)
    inits = [init("two", np.array(2, F)), init("eps", np.array(1e-5, F)),
             init("g", rng.uniform(0.5, 1.5, c).astype(F)), init("b", rng.random(c).astype(F))]
    return inits + ([init("axes", np.array([-1], np.int64))] if opset >= 18 else [])


@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize(("square", "inverse"), [("pow", "div"), ("mul", "div"),
                                                 ("pow", "reciprocal")],
                         ids=["pytorch", "paddle", "paddle_reciprocal"])
@pytest.mark.parametrize("affine", [True, False])
def test_decomposed_layer_norm_is_one_node(opset: int, square: str, inverse: str,
                                           affine: bool) -> None:
    m = model(layer_norm_nodes(opset, square, inverse, affine), {"x": ([2, 5, 16], FLOAT)},
              ["y"], layer_norm_inits(opset, 16), opset=opset)
    g = import_model(m)
    assert [n.op for n in g] == [Op.LAYER_NORM]
    (node,) = list(g)
    assert node.attrs.axis == 2 and node.attrs.epsilon == pytest.approx(1e-5)
    assert len(node.origin) == (9 if affine else 7) + (inverse == "reciprocal")
    x = np.random.default_rng(1).standard_normal((2, 5, 16)).astype(F) * 3 + 1
    want = run_ort(m, {"x": x}, optimized=False)[0]
    for mode in ("reference", "fused"):
        np.testing.assert_allclose(compile_model(m, mode=mode).run({"x": x})["y"], want,
                                   rtol=1e-5, atol=1e-5)


def test_layer_norm_over_leading_axes_or_with_a_shared_value_is_not_fused() -> None:
    nodes = layer_norm_nodes(13, "pow", "div", True)
    nodes[0] = helper.make_node("ReduceMean", ["x"], ["mean"], axes=[1])  # not trailing
    m = model(nodes, {"x": ([2, 5, 16], FLOAT)}, ["y"], layer_norm_inits(13, 16), opset=13)
    assert Op.LAYER_NORM not in [n.op for n in import_model(m)]
    nodes = layer_norm_nodes(13, "pow", "div", True)  # d also read outside the pattern
    m = model([*nodes, helper.make_node("Relu", ["d"], ["z"])], {"x": ([2, 16], FLOAT)},
              ["y", "z"], layer_norm_inits(13, 16), opset=13)
    assert Op.LAYER_NORM not in [n.op for n in import_model(m)]


def _qdq(value: str, out: str, scale: str, zp: str, name: str) -> list:
    return [helper.make_node("QuantizeLinear", [value, scale, zp], [f"{name}_q"], name=name),
            helper.make_node("DequantizeLinear", [f"{name}_q", scale, zp], [out],
                             name=f"{name}_dq")]


def test_layer_norm_with_qdq_around_it() -> None:
    qp = [init("sx", np.array(0.05, F)), init("sy", np.array(0.02, F)),
          init("zp", np.array(0, np.int8))]
    nodes = [*_qdq("inp", "x", "sx", "zp", "qin"),
             *layer_norm_nodes(13, "pow", "div", True, y="ln"),
             *_qdq("ln", "y", "sy", "zp", "qout")]
    m = model(nodes, {"inp": ([1, 8, 32], FLOAT)}, ["y"], [*layer_norm_inits(13, 32), *qp],
              opset=13)
    assert Op.LAYER_NORM in [n.op for n in import_model(m)]
    x = np.random.default_rng(2).standard_normal((1, 8, 32)).astype(F)
    want = run_ort(m, {"inp": x}, optimized=False)[0]
    got = compile_model(m, mode="fused").run({"inp": x})["y"]
    assert np.abs(got - want).max() <= 0.02 * 1.0001  # one output step at most (rounding ties)


@pytest.mark.parametrize("variant", ["div", "mul"], ids=["pytorch", "paddle"])
def test_erf_gelu_with_qdq_around_it(variant: str) -> None:
    qp = [init("s", np.array(0.03, F)), init("zp", np.array(0, np.int8))]
    nodes = [*_qdq("inp", "x", "s", "zp", "qin"), *gelu_erf(variant),
             *_qdq("g", "y", "s", "zp", "qout")]
    m = model(nodes, {"inp": ([4, 64], FLOAT)}, ["y"], qp, opset=17)
    assert [n.op for n in import_model(m)].count(Op.GELU) == 1
    x = np.linspace(-3, 3, 256, dtype=F).reshape(4, 64)
    want = run_ort(m, {"inp": x}, optimized=False)[0]
    for mode in ("reference", "fused"):
        got = compile_model(m, mode=mode).run({"inp": x})["y"]
        assert np.abs(got - want).max() <= 0.03 * 1.0001
