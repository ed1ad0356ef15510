"""Decomposed LayerNorms as ONNX Runtime's tools leave them (patterns.fuse_layer_norm):

- quant_pre_process's transpose optimizer moves a Transpose between the centring Sub and the
  rest: mean over x's axis 1, then Transpose(x - mean, perm), then the variance over the last
  axis. That is LayerNormalization(Transpose(x, perm)) when perm maps the variance's trailing
  axes onto the mean's axes: one Transpose and one LayerNormalization.
- quantize_static stores the Add's epsilon as a DequantizeLinear of a quantized constant: the
  epsilon is that dequantized value.
- quantize_static also quantizes the variance (a Q/DQ pair between ReduceMean and the Add):
  folding the pattern would drop a rounding the model specifies, so it is not folded; its ops
  are native (reduction, eltwise) and compute the model as written (PP-OCRv4's recognizer).
"""

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


def transposed_layer_norm(mean_axes: list[int], perm: list[int], var_axes: list[int],
                          eps: str = "eps", var_qdq: bool = False) -> list:
    nodes = [helper.make_node("ReduceMean", ["x"], ["mean"], axes=mean_axes, name="mean"),
             helper.make_node("Sub", ["x", "mean"], ["d"], name="sub"),
             helper.make_node("Transpose", ["d"], ["t"], perm=perm, name="transpose"),
             helper.make_node("Pow", ["t", "two"], ["p"], name="pow"),
             helper.make_node("ReduceMean", ["p"], ["var"], axes=var_axes, name="var")]
    if var_qdq:
        nodes += [helper.make_node("QuantizeLinear", ["var", "sv", "zv"], ["vq"], name="vq"),
                  helper.make_node("DequantizeLinear", ["vq", "sv", "zv"], ["vd"], name="vd")]
    nodes += [helper.make_node("Add", ["vd" if var_qdq else "var", eps], ["ve"], name="add"),
              helper.make_node("Sqrt", ["ve"], ["s"], name="sqrt"),
              helper.make_node("Div", ["t", "s"], ["n"], name="div"),
              helper.make_node("Mul", ["n", "g"], ["gn"], name="gamma"),
              helper.make_node("Add", ["gn", "b"], ["y"], name="beta")]
    return nodes


def inits(channels: int) -> list:
    rng = np.random.default_rng(channels)
    return [init("two", np.array(2, F)), init("eps", np.array(1e-5, F)),
            init("g", rng.uniform(0.5, 1.5, channels).astype(F)),
            init("b", rng.random(channels).astype(F))]


FORMS = [  # x shape, mean axes, perm, variance axes, normalized channels
    ((2, 16, 10), [1], [0, 2, 1], [-1], 16),
    ((1, 8, 3, 5), [-3], [0, 2, 3, 1], [-1], 8),
    ((2, 4, 6, 5), [1, 2], [0, 3, 1, 2], [-2, -1], 6),
]


@pytest.mark.parametrize(("shape", "mean_axes", "perm", "var_axes", "channels"), FORMS, ids=str)
def test_layer_norm_through_a_transpose_is_a_transpose_and_one_node(
        shape: tuple[int, ...], mean_axes: list[int], perm: list[int], var_axes: list[int],
        channels: int) -> None:
    m = model(transposed_layer_norm(mean_axes, perm, var_axes), {"x": (list(shape), FLOAT)},
              ["y"], inits(channels), opset=13)
    g = import_model(m)
    assert [n.op for n in g.topo_order()] == [Op.TRANSPOSE, Op.LAYER_NORM]
    ln = next(n for n in g if n.op is Op.LAYER_NORM)
    assert ln.attrs.axis == len(shape) - len(var_axes) and ln.attrs.epsilon == pytest.approx(1e-5)
    x = (np.random.default_rng(3).standard_normal(shape) * 2 + 1).astype(F)
    want = run_ort(m, {"x": x}, optimized=False)[0]
    for mode in ("reference", "fused"):
        np.testing.assert_allclose(compile_model(m, mode=mode).run({"x": x})["y"], want,
                                   rtol=1e-5, atol=1e-5, err_msg=mode)


def test_a_transpose_that_moves_other_axes_is_not_folded() -> None:
    """Mean over x's axis 1, variance over t's last axis, which is x's axis 2: two different
    normalizations, left as written (and native: no islands)."""
    m = model(transposed_layer_norm([1], [0, 1, 2], [-1]), {"x": ([2, 16, 16], FLOAT)}, ["y"],
              inits(16), opset=13)
    ops = [n.op for n in import_model(m)]
    assert Op.LAYER_NORM not in ops and Op.ISLAND not in ops
    x = np.random.default_rng(4).standard_normal((2, 16, 16)).astype(F)
    want = run_ort(m, {"x": x}, optimized=False)[0]
    np.testing.assert_allclose(compile_model(m).run({"x": x})["y"], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shared", [False, True])
def test_epsilon_dequantized_from_a_quantized_constant(shared: bool) -> None:
    """The DequantizeLinear is absorbed when only the pattern reads it; when another node
    reads it too (one eps for every LayerNorm of a model) it stays for that reader."""
    eps = [init("eq", np.array(3, np.uint8)), init("es", np.array(4e-6, F)),
           init("ez", np.array(0, np.uint8))]
    nodes = [helper.make_node("DequantizeLinear", ["eq", "es", "ez"], ["epsd"], name="eps_dq"),
             *transposed_layer_norm([1], [0, 2, 1], [-1], eps="epsd")]
    outputs = ["y"]
    if shared:
        nodes.append(helper.make_node("Add", ["x", "epsd"], ["z"], name="other"))
        outputs.append("z")
    m = model(nodes, {"x": ([2, 16, 10], FLOAT)}, outputs, [*inits(16), *eps], opset=13)
    (ln,) = [n for n in import_model(m) if n.op is Op.LAYER_NORM]
    assert ln.attrs.epsilon == float(F(3) * F(4e-6))
    assert ("eps_dq" in ln.origin) is not shared
    x = np.random.default_rng(5).standard_normal((2, 16, 10)).astype(F) * F(0.01)
    want = run_ort(m, {"x": x}, optimized=False)
    got = compile_model(m).run({"x": x})
    for name, expected in zip(outputs, want, strict=True):
        np.testing.assert_allclose(got[name], expected, rtol=1e-5, atol=1e-5, err_msg=name)


def test_quantized_variance_is_not_folded_and_runs_natively() -> None:
    qv = [init("sv", np.array(0.02, F)), init("zv", np.array(0, np.uint8))]
    m = model(transposed_layer_norm([1], [0, 2, 1], [-1], var_qdq=True),
              {"x": ([2, 16, 10], FLOAT)}, ["y"], [*inits(16), *qv], opset=13)
    ops = [n.op for n in import_model(m)]
    assert Op.LAYER_NORM not in ops and Op.ISLAND not in ops
    assert {Op.REDUCE_MEAN, Op.POW, Op.SQRT} <= set(ops)
    x = np.random.default_rng(6).standard_normal((2, 16, 10)).astype(F)
    want = run_ort(m, {"x": x}, optimized=False)[0]
    compiled = compile_model(m)
    kinds = {k["primitive"] for k in compiled.inspect()["kernels"]}
    assert {"reduction", "eltwise"} <= kinds and not kinds & {"island", "numpy"}
    got = compiled.run({"x": x})["y"]
    # the variance is quantized in steps of 0.02: a float32 sum-order difference that moves
    # one variance across a rounding tie changes its row by one step; every other row agrees
    # to float32 rounding
    rows = np.abs(got - want).max(axis=-1) > 1e-5 * (1 + np.abs(want).max())
    assert rows.mean() <= 0.05, rows.mean()
