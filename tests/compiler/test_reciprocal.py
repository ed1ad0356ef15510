"""Neg, Reciprocal and a Div / Sub whose first operand is a broadcast constant (``1 / x``: RMSNorm's
rsqrt as torch.export writes it, Reciprocal of Sqrt, and as the TorchScript exporter writes it,
Div(1, Sqrt)): the binary primitive with the constant stored expanded
(lower_misc._first_operand_stored), bit-exact against onnxruntime; before, numpy kernels
("the first operand is broadcast") and onnxruntime islands (Reciprocal)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx_builders import init, model, run_ort

from qfuse.compiler.api import compile_model
from qfuse.compiler.onnx_import import import_model
from qfuse.ir import Op

F = np.float32
SHAPE = (2, 5, 7)


@pytest.mark.parametrize(("op", "constant"), [
    ("Reciprocal", None), ("Div", np.array(1.0, F)), ("Div", np.arange(1, 8, dtype=F)),
    ("Sub", np.array(1.0, F)), ("Sub", np.arange(1, 8, dtype=F))], ids=str)
def test_constant_over_x_is_native_and_exact(op: str, constant: np.ndarray | None) -> None:
    if constant is None:
        node, inits = helper.make_node("Reciprocal", ["x"], ["y"]), []
    else:
        node, inits = helper.make_node(op, ["c", "x"], ["y"]), [init("c", constant)]
    m = model([node], {"x": (SHAPE, TensorProto.FLOAT)}, ["y"], inits)
    assert Op.ISLAND not in [n.op for n in import_model(m)]
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(F)
    want = run_ort(m, {"x": x})[0]
    for mode in ("fused", "unfused", "reference"):
        compiled = compile_model(m, mode=mode)
        np.testing.assert_array_equal(compiled.run({"x": x})["y"], want, err_msg=mode)
        if mode == "fused":
            assert [k["impl"] for k in compiled.inspect()["kernels"]] == ["jit:uni"]


def test_neg_is_a_multiply_by_minus_one_and_keeps_the_sign_of_zero() -> None:
    """Neg as Mul(x, −1) (rotary embeddings' rotate_half): bit-exact against onnxruntime,
    +0 → −0 and −0 → +0 included; before, an onnxruntime island."""
    m = model([helper.make_node("Neg", ["x"], ["y"])], {"x": (SHAPE, TensorProto.FLOAT)},
              ["y"])
    assert [n.op for n in import_model(m)] == [Op.MUL]
    x = np.random.default_rng(1).standard_normal(SHAPE).astype(F)
    x.reshape(-1)[:4] = [0.0, -0.0, np.finfo(F).max, np.finfo(F).tiny]
    want = run_ort(m, {"x": x})[0]
    for mode in ("fused", "unfused", "reference"):
        got = compile_model(m, mode=mode).run({"x": x})["y"]
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), mode
