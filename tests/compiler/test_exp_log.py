"""Exp and Log of float32: IR ops (they were onnxruntime islands). Exp on oneDNN's eltwise,
within 6 float32 steps of onnxruntime's; Log in numpy (oneDNN's eltwise log is 29 steps off at
log(0.26); numpy's is the reference's, within 3 steps of onnxruntime's: docs/numerics.md).
Between a dequantize and a quantize either is a 256-entry table (passes/table_lookup.py
NOT_POST_OPS), bit-exact with the reference."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from qfuse.compiler.api import compile_model
from tests.compiler.onnx_builders import init, model, run_ort

F32 = np.float32


@pytest.mark.parametrize("op", ["Exp", "Log"])
def test_float_exp_and_log_are_native(op: str) -> None:
    m = model([helper.make_node(op, ["x"], ["y"])], {"x": ((4, 5000), TensorProto.FLOAT)},
              ["y"])
    compiled = compile_model(m)
    [kernel] = compiled.inspect()["kernels"]
    if op == "Exp":
        assert kernel["primitive"] == "eltwise" and kernel["impl"].startswith("jit"), kernel
    else:
        assert kernel["primitive"] == "numpy", kernel
    rng = np.random.default_rng(0)
    x = (rng.uniform(-80, 80, (4, 5000)) if op == "Exp"
         else np.exp(rng.uniform(-60, 60, (4, 5000)))).astype(F32)
    got, want = compiled.run({"x": x})["y"], run_ort(m, {"x": x})[0]
    if op == "Exp":  # relative: oneDNN's exp is within 6 steps of onnxruntime's (measured)
        steps = np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32))
        assert steps.max() <= 8
    else:  # numpy's log: within 3 steps of onnxruntime's
        steps = np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32))
        assert steps.max() <= 3


def test_a_quantized_log_is_a_table() -> None:
    """DQ → Log → Q (a log-mel's floor of quantized energies): one table, exact."""
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
             helper.make_node("Log", ["d"], ["l"]),
             helper.make_node("QuantizeLinear", ["l", "ls", "lz"], ["lq"]),
             helper.make_node("DequantizeLinear", ["lq", "ls", "lz"], ["y"])]
    m = model(nodes, {"x": ((1, 64, 32), TensorProto.FLOAT)}, ["y"],
              [init("s", F32(0.05)), init("z", np.uint8(0)), init("ls", F32(0.04)),
               init("lz", np.uint8(200))])
    compiled = compile_model(m)
    assert any("a table of x's 256 values" in k.get("note", "")
               for k in compiled.inspect()["kernels"]), compiled.inspect()["kernels"]
    x = {"x": np.random.default_rng(1).uniform(0, 12, (1, 64, 32)).astype(F32)}
    assert np.array_equal(compiled.run(x)["y"], compile_model(m, mode="reference").run(x)["y"])
