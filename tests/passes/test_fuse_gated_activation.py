"""x·gate(x) → one activation (passes/fuse_gated_activation.py): each exporter form, with and
without quantizers on the gate, matching and declining; the rewrite measured in output steps."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as h

from qfuse.compiler.api import compile_model, import_graph
from qfuse.compiler.pipeline import run_pipeline
from qfuse.ir import Op
from qfuse.ir.postops import ComposerOptions
from qfuse.passes.base import PassContext
from qfuse.runtime.numerics import step_diff
from qfuse.runtime.reference import evaluate

S_X, ZP_X = 0.05, 128  # x = DQ(Q(input)): x in [-6.4, 6.35]
S_Y, ZP_Y = 0.03, 20


def _model(gate: list[onnx.NodeProto], gate_out: str, consts: dict[str, float],
           after: list[onnx.NodeProto] = (), y: str = "m",
           extra: list[onnx.TensorProto] = (), mul_reads: str = "x") -> onnx.ModelProto:
    """input → Q/DQ → x; gate nodes compute ``gate_out`` from x; m = Mul(x, gate_out);
    ``after`` may continue from m to ``y``; y → Q/DQ → out."""
    inits = [h.make_tensor(k, TensorProto.FLOAT, [], [v]) for k, v in consts.items()]
    inits += list(extra)
    inits += [h.make_tensor("sx", TensorProto.FLOAT, [], [S_X]),
              h.make_tensor("zx", TensorProto.UINT8, [], [ZP_X]),
              h.make_tensor("sy", TensorProto.FLOAT, [], [S_Y]),
              h.make_tensor("zy", TensorProto.UINT8, [], [ZP_Y])]
    nodes = [h.make_node("QuantizeLinear", ["input", "sx", "zx"], ["xq"]),
             h.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["x"]),
             *gate, h.make_node("Mul", [mul_reads, gate_out], ["m"]), *after,
             h.make_node("QuantizeLinear", [y, "sy", "zy"], ["yq"]),
             h.make_node("DequantizeLinear", ["yq", "sy", "zy"], ["out"])]
    graph = h.make_graph(nodes, "gated", [h.make_tensor_value_info("input", TensorProto.FLOAT,
                                                                   [1, 8, 6, 6])],
                         [h.make_tensor_value_info("out", TensorProto.FLOAT, [1, 8, 6, 6])],
                         inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def _qdq(name: str, scale: float, zp: int, src: str, dst: str) -> list[onnx.NodeProto]:
    return [h.make_node("Constant", [], [f"{name}_s"], value=h.make_tensor(
                "v", TensorProto.FLOAT, [], [scale])),
            h.make_node("Constant", [], [f"{name}_z"], value=h.make_tensor(
                "v", TensorProto.UINT8, [], [zp])),
            h.make_node("QuantizeLinear", [src, f"{name}_s", f"{name}_z"], [f"{name}_q"]),
            h.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [dst])]


SIGMOID = [h.make_node("Sigmoid", ["x"], ["g"])]
HSIGMOID = [h.make_node("HardSigmoid", ["x"], ["g"], alpha=1 / 6, beta=0.5)]
RELU6 = [h.make_node("Add", ["x", "three"], ["a"]), h.make_node("Clip", ["a", "zero", "six"],
                                                                 ["g"])]
RELU6_DIV = [*RELU6[:1], h.make_node("Clip", ["a", "zero", "six"], ["c"]),
             h.make_node("Div", ["c", "six"], ["g"])]
THREE = {"three": 3.0, "zero": 0.0, "six": 6.0}

CASES = {
    # name: (gate nodes, gate output, constants, after-Mul nodes, y, activation, max steps)
    "silu": (SIGMOID, "g", {}, [], "m", Op.SWISH, 1),
    "silu_gate_qdq": ([h.make_node("Sigmoid", ["x"], ["s"]), *_qdq("gs", 1 / 255, 0, "s", "g")],
                      "g", {}, [], "m", Op.SWISH, 1),
    "x_hardsigmoid": (HSIGMOID, "g", {}, [], "m", Op.HARD_SWISH, 1),
    "x_relu6_div6": (RELU6_DIV, "g", THREE, [], "m", Op.HARD_SWISH, 1),
    "x_relu6_then_div6": (RELU6, "g", THREE, [h.make_node("Div", ["m", "six"], ["y"])], "y",
                          Op.HARD_SWISH, 1),
    # quantize_static drops the Clip: the gate's quantizer [0, 3.9] is the clamp
    "x_qdq_add3": ([h.make_node("Add", ["x", "three"], ["a"]),
                    *_qdq("ga", 3.9 / 255, 0, "a", "g")], "g", {"three": 3.0},
                   [h.make_node("Div", ["m", "six"], ["y"])], "y", Op.HARD_SWISH, 1),
}
CASES["x_qdq_add3"][2]["six"] = 6.0


DROP_GATES = ComposerOptions().with_("drop_gate_quantize")


def _before_after(model: onnx.ModelProto, composer: ComposerOptions = DROP_GATES) -> tuple:
    before = import_graph(model)
    after = before.copy()
    results = run_pipeline(after, PassContext(composer=composer), until="fuse_gated_activation")
    return before, after, {r.name: r for r in results}


def _feeds(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"input": (rng.standard_normal((1, 8, 6, 6)) * 3).astype(np.float32)}


@pytest.mark.parametrize("name", list(CASES))
def test_gated_activation_is_one_node_within_one_step(name: str) -> None:
    gate, gate_out, consts, after_nodes, y, op, steps = CASES[name]
    model = _model(gate, gate_out, consts, after_nodes, y)
    before, after, results = _before_after(model)
    assert results["fuse_gated_activation"].changed == 1
    ops = [n.op for n in after.topo_order()]
    assert op in ops and Op.SIGMOID not in ops and Op.HARD_SIGMOID not in ops
    for seed in range(3):
        feeds = _feeds(seed)
        a, b = evaluate(before, feeds)["out"], evaluate(after, feeds)["out"]
        assert step_diff(a, b, S_Y).max_steps <= steps


def test_exact_when_the_gate_has_no_quantizer() -> None:
    """Without a quantizer on the gate only float32 roundings differ: the output quantization
    is identical except where the exact x·relu6(x + 3)/6/s sits on a rounding tie (x is on a
    grid of 0.05, so exact ties are common here)."""
    before, after, _ = _before_after(_model(RELU6_DIV, "g", THREE))
    feeds = _feeds(0)
    a, b = evaluate(before, feeds)["out"], evaluate(after, feeds)["out"]
    assert step_diff(a, b, S_Y).max_steps <= 1
    x = (np.clip(np.rint(feeds["input"].astype(np.float64) / S_X) + ZP_X, 0, 255) - ZP_X) * S_X
    exact = x * np.clip(x + 3, 0, 6) / 6 / S_Y
    near_tie = np.abs(np.abs(exact - np.floor(exact)) - 0.5) < 1e-4
    assert np.all(near_tie[a != b])


def test_a_quantized_gate_is_kept_by_default() -> None:
    """Dropping the gate's quantizer is opt-in (it compounds over layers)."""
    gate, gate_out, consts, after_nodes, y, _, _ = CASES["silu_gate_qdq"]
    _, after, results = _before_after(_model(gate, gate_out, consts, after_nodes, y),
                                      ComposerOptions())
    assert results["fuse_gated_activation"].changed == 0
    assert any("drop_gate_quantize" in d.reason
               for d in results["fuse_gated_activation"].declined)
    assert Op.SIGMOID in [n.op for n in after.topo_order()]
    # an unquantized gate fuses by default
    assert _before_after(_model(SIGMOID, "g", {}), ComposerOptions())[2][
        "fuse_gated_activation"].changed == 1


def test_declines_a_gate_that_caps_where_x_reaches() -> None:
    """A sigmoid quantizer capped at 0.5 binds for every x > 0: not a SiLU."""
    gate = [h.make_node("Sigmoid", ["x"], ["s"]), *_qdq("gs", 0.5 / 255, 0, "s", "g")]
    _, after, results = _before_after(_model(gate, "g", {}))
    assert results["fuse_gated_activation"].changed == 0
    assert any("binds where x can be" in d.reason
               for d in results["fuse_gated_activation"].declined)
    assert Op.SIGMOID in [n.op for n in after.topo_order()]


def test_no_match_on_unrelated_product_or_shared_gate() -> None:
    shared = [h.make_node("Sigmoid", ["x"], ["g"]), h.make_node("Add", ["g", "x"], ["t"])]
    model = _model(shared, "g", {}, [h.make_node("Add", ["m", "t"], ["y"])], "y")
    assert _before_after(model)[2]["fuse_gated_activation"].changed == 0
    other = [h.make_node("Sigmoid", ["input"], ["g"])]  # the gate reads another tensor
    assert _before_after(_model(other, "g", {}))[2]["fuse_gated_activation"].changed == 0


def test_silu_fuses_into_the_conv_kernel() -> None:
    """Conv → x·sigmoid(x) → quantize is one int8 convolution with an eltwise_swish post-op."""
    rng = np.random.default_rng(1)
    w = h.make_tensor("w", TensorProto.INT8, [8, 8, 3, 3],
                      rng.integers(-60, 60, 8 * 8 * 9).tolist())
    ws = h.make_tensor("ws", TensorProto.FLOAT, [8], (rng.uniform(1, 2, 8) * 1e-3).tolist())
    wz = h.make_tensor("wz", TensorProto.INT8, [8], [0] * 8)
    conv = [h.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wf"], axis=0),
            h.make_node("Conv", ["x", "wf"], ["c"], pads=[1, 1, 1, 1]),
            *_qdq("cq", 0.02, 128, "c", "cd"),
            h.make_node("Sigmoid", ["cd"], ["s"]), *_qdq("gs", 1 / 255, 0, "s", "g")]
    model = _model(conv, "g", {}, extra=[w, ws, wz], mul_reads="cd")
    compiled = compile_model(model, composer=DROP_GATES)
    info = compiled.inspect()
    convs = [k for k in info["kernels"] if k["primitive"] == "convolution"]
    assert convs and all("eltwise_swish" in k["post_ops"] for k in convs)
    assert not [n for n in info["not_fused"] if n["op"] in ("Sigmoid", "Mul", "Swish")]
    reference = compile_model(model, mode="reference")
    for seed in range(3):
        feeds = _feeds(seed)
        diff = step_diff(compiled.run(feeds)["out"], reference.run(feeds)["out"], S_Y)
        assert diff.max_steps <= 1, diff
