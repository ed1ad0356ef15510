"""BatchNormalization after a quantized conv → Mul + Add per channel, absorbed by the conv's
post-op chain (passes/decompose_batchnorm.py); a standalone BatchNorm stays."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as h
from onnx import numpy_helper as nh

from qfuse.ir.chain import ONNX_FORM
from qfuse.compiler.api import compile_model, import_graph
from qfuse.compiler.lower import Options, lower
from qfuse.compiler.modes import run_passes
from qfuse.compiler.pipeline import run_pipeline
from qfuse.ir import Op
from qfuse.passes.base import PassContext
from qfuse.runtime.executor import Executor
from qfuse.runtime.numerics import step_diff
from qfuse.runtime.reference import evaluate

C, S_Y, ZP_Y = 8, 0.04, 0


def _model(after_conv: bool, conv_quantized: bool = False, quantized_after: bool = True,
           float_input: bool = False, conv_after: bool = False) -> onnx.ModelProto:
    """input → Q/DQ → [int8-weight Conv → [Q/DQ →]] BatchNorm → Relu → Q/DQ → out (NNCF's
    layouts: with ``conv_quantized`` the conv's output is quantized before the BN, as NNCF
    does after depthwise convs); without ``quantized_after`` the Relu writes ``out``; with
    ``float_input`` the BN reads the float input (NNCF's DenseNet: a Concat of float maps);
    with ``conv_after`` an int8 Conv reads the quantized output and writes ``out``."""
    rng = np.random.default_rng(3)
    inits = [nh.from_array(rng.integers(-100, 100, (C, C, 3, 3)).astype(np.int8), "w"),
             nh.from_array(rng.uniform(1e-3, 3e-3, C).astype(np.float32), "ws"),
             nh.from_array(np.zeros(C, np.int8), "wz"),
             nh.from_array(rng.uniform(0.5, 2, C).astype(np.float32), "gamma"),
             nh.from_array(rng.uniform(-1, 1, C).astype(np.float32), "beta"),
             nh.from_array(rng.uniform(-1, 1, C).astype(np.float32), "mean"),
             nh.from_array(rng.uniform(0.2, 3, C).astype(np.float32), "var"),
             nh.from_array(np.array(0.05, np.float32), "sx"),
             nh.from_array(np.array(128, np.uint8), "zx"),
             nh.from_array(np.array(S_Y, np.float32), "sy"),
             nh.from_array(np.array(ZP_Y, np.uint8), "zy"),
             nh.from_array(np.array(0.07, np.float32), "sc"),
             nh.from_array(np.array(3, np.int8), "zc")]
    bn_in = ("cd" if conv_quantized else "c") if after_conv else "input" if float_input else "x"
    nodes = [h.make_node("QuantizeLinear", ["input", "sx", "zx"], ["xq"]),
             h.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["x"]),
             h.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wf"], axis=0),
             h.make_node("Conv", ["x", "wf"], ["c"], pads=[1, 1, 1, 1]),
             h.make_node("QuantizeLinear", ["c", "sc", "zc"], ["cq"]),
             h.make_node("DequantizeLinear", ["cq", "sc", "zc"], ["cd"]),
             h.make_node("BatchNormalization", [bn_in, "gamma", "beta", "mean", "var"], ["b"]),
             h.make_node("Relu", ["b"], ["r" if quantized_after else "out"])]
    if quantized_after:
        nodes += [h.make_node("QuantizeLinear", ["r", "sy", "zy"], ["yq"]),
                  h.make_node("DequantizeLinear", ["yq", "sy", "zy"],
                              ["y" if conv_after else "out"])]
    if conv_after:
        nodes.append(h.make_node("Conv", ["y", "wf"], ["out"], pads=[1, 1, 1, 1]))
    outputs = [h.make_tensor_value_info("out", TensorProto.FLOAT, [1, C, 6, 6])]
    if not after_conv:
        outputs.append(h.make_tensor_value_info("c", TensorProto.FLOAT, [1, C, 6, 6]))
    graph = h.make_graph(nodes, "bn", [h.make_tensor_value_info("input", TensorProto.FLOAT,
                                                                [1, C, 6, 6])], outputs, inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def _feeds(seed: int) -> dict[str, np.ndarray]:
    return {"input": np.random.default_rng(seed).standard_normal((1, C, 6, 6)).astype(np.float32)}


def test_batchnorm_after_a_quantized_conv_joins_its_kernel() -> None:
    model = _model(after_conv=True)
    before = import_graph(model)
    after = before.copy()
    results = {r.name: r for r in run_pipeline(after, PassContext(), until="decompose_batchnorm")}
    assert results["fold_batchnorm"].changed == 0  # int8 weights are not rescaled
    assert results["decompose_batchnorm"].changed == 1
    assert Op.BATCH_NORM not in [n.op for n in after.topo_order()]
    for seed in range(3):  # float32 re-association only: at most one step, at near-ties
        diff = step_diff(evaluate(before, _feeds(seed))["out"],
                         evaluate(after, _feeds(seed))["out"], S_Y)
        assert diff.max_steps <= 1 and diff.identical >= 0.99
    compiled = compile_model(model)
    info = compiled.inspect()
    assert not [n for n in info["not_fused"] if n["op"] in ("BatchNormalization", "Mul", "Add")]
    # the only binary kernel is the graph input's quantize (ONNX rounding, lower_quant.py)
    binaries = [k for k in info["kernels"] if k["primitive"] == "binary"]
    assert [k.get("rounding") for k in binaries] == [ONNX_FORM]
    reference = compile_model(model, mode="reference")
    for seed in range(3):
        assert step_diff(compiled.run(_feeds(seed))["out"],
                         reference.run(_feeds(seed))["out"], S_Y).max_steps <= 1


def test_standalone_batchnorm_stays() -> None:
    """Neither after a compute node nor quantized after: one batch normalization kernel."""
    graph = import_graph(_model(after_conv=False, quantized_after=False))
    results = {r.name: r for r in run_pipeline(graph, PassContext(), until="decompose_batchnorm")}
    assert results["decompose_batchnorm"].changed == 0
    assert any("standalone BatchNorm" in d.reason for d in results["decompose_batchnorm"].declined)
    assert Op.BATCH_NORM in [n.op for n in graph.topo_order()]


def test_batchnorm_after_a_quantized_conv_output_joins_its_kernel() -> None:
    """conv → Q → DQ → BN → Relu → Q: the conv's chain keeps its quantize as post-ops and
    takes the BN's Mul + Add (PP-OCR cls NNCF: 252 → 194 kernels)."""
    model = _model(after_conv=True, conv_quantized=True)
    graph = import_graph(model)
    results = {r.name: r for r in run_pipeline(graph, PassContext(), until="decompose_batchnorm")}
    assert results["decompose_batchnorm"].changed == 1
    compiled = compile_model(model)
    info = compiled.inspect()
    assert not [n for n in info["not_fused"] if n["op"] in ("BatchNormalization", "Mul", "Add")]
    (conv,) = [k for k in info["kernels"] if k["name"] == "Conv_3"]
    assert {"BatchNormalization_6", "Relu_7"} <= set(conv["absorbed"]), conv["absorbed"]
    reference = compile_model(model, mode="reference")
    for seed in range(3):
        assert step_diff(compiled.run(_feeds(seed))["out"],
                         reference.run(_feeds(seed))["out"], S_Y).max_steps <= 1


@pytest.mark.parametrize("float_input", [False, True])
def test_preactivation_batchnorm_then_quantize_is_one_kernel(float_input: bool) -> None:
    """DenseNet's pre-activation ``[DQ →] BN → Relu → Q``: the Mul starts a gate chain
    (fuse_gate_chain) through the Add, the Relu and the quantize: one binary primitive (from
    the 8-bit source itself when a DequantizeLinear gives it) for what were the dequantize,
    the batch normalization and the quantize kernels. The same float32 operations as the
    batch normalization kernel (x·a, + b): bit-identical with the pass off and in the
    unfused mode."""
    model = _model(after_conv=False, float_input=float_input, conv_after=True)
    graph = import_graph(model)
    results = {r.name: r for r in run_pipeline(graph, PassContext(), until="decompose_batchnorm")}
    assert results["decompose_batchnorm"].changed == 1
    compiled = compile_model(model)
    info = compiled.inspect()
    assert not [n for n in info["not_fused"] if n["op"] in ("BatchNormalization", "Mul", "Add",
                                                           "Relu")]
    (kernel,) = [k for k in info["kernels"] if "BatchNormalization_6" in k["absorbed"]]
    assert kernel["primitive"] == "binary" and kernel["impl"].startswith("jit"), kernel
    assert (kernel["src_dtype"], kernel["dst_dtype"]) == ("f32" if float_input else "u8", "u8")
    assert {"Relu_7", "QuantizeLinear_8"} <= set(kernel["absorbed"]), kernel["absorbed"]
    graph = import_graph(model)
    run_passes(graph, "fused", PassContext(disabled_passes=frozenset({"decompose_batchnorm"})))
    before = Executor(lower(graph, Options(mode="fused")))
    assert len(info["kernels"]) == len(before.plan.kernels) - (1 if float_input else 2)
    unfused = compile_model(model, mode="unfused")
    for seed in range(3):
        out = compiled.run(_feeds(seed))["out"]
        np.testing.assert_array_equal(out, before.run(_feeds(seed))["out"])
        np.testing.assert_array_equal(out, unfused.run(_feeds(seed))["out"])
        # a step of y moves the conv's output by at most Σ|w|·s_w·S_Y: compare y itself
    y_model = _model(after_conv=False, float_input=float_input)
    y_compiled, y_reference = compile_model(y_model), compile_model(y_model, mode="reference")
    for seed in range(3):
        diff = step_diff(y_compiled.run(_feeds(seed))["out"],
                         y_reference.run(_feeds(seed))["out"], S_Y)
        assert diff.max_steps <= 1 and diff.identical >= 0.99


def test_batchnorm_parameters_through_dequantize_linear() -> None:
    """quantize_static quantizes a standalone BatchNorm's scale and bias as weights
    (DequantizeLinear of constants): they are constants all the same."""
    model = _model(after_conv=False)
    inits = {t.name: t for t in model.graph.initializer}
    gamma = nh.to_array(inits["gamma"])
    step = float(np.abs(gamma).max()) / 127
    model.graph.initializer.remove(inits["gamma"])
    model.graph.initializer.extend([
        nh.from_array(np.rint(gamma / step).astype(np.int8), "gamma_q"),
        nh.from_array(np.array(step, np.float32), "gamma_s")])
    model.graph.node.insert(0, h.make_node("DequantizeLinear", ["gamma_q", "gamma_s"],
                                           ["gamma"]))
    onnx.checker.check_model(model)
    graph = import_graph(model)
    results = {r.name: r for r in run_pipeline(graph, PassContext(), until="decompose_batchnorm")}
    assert results["decompose_batchnorm"].changed == 1, results["decompose_batchnorm"].declined
    reference = compile_model(model, mode="reference")
    compiled = compile_model(model)
    for seed in range(3):
        diff = step_diff(compiled.run(_feeds(seed))["out"],
                         reference.run(_feeds(seed))["out"], S_Y)
        assert diff.max_steps <= 1 and diff.identical >= 0.99


def _linear_norm(rows: int = 6, tokens: int = 5) -> onnx.ModelProto:
    """LeViT's LinearNorm: int8 MatMul [B, N, K]·[K, C] → Q → DQ → Flatten to [B·N, C] →
    BatchNorm (2-D: C is the last dim) → Reshape to [B, N, C] → HardSwish → Q → DQ."""
    rng = np.random.default_rng(5)
    inits = [nh.from_array(rng.integers(-100, 100, (C, C)).astype(np.int8), "w"),
             nh.from_array(np.float32(2e-3), "ws"), nh.from_array(np.int8(0), "wz"),
             nh.from_array(np.float32(0.05), "xs"), nh.from_array(np.int8(0), "xz"),
             nh.from_array(np.float32(0.03), "ms"), nh.from_array(np.int8(0), "mz"),
             nh.from_array(np.float32(S_Y), "ys"), nh.from_array(np.int8(ZP_Y), "yz"),
             nh.from_array(rng.uniform(0.5, 2, C).astype(np.float32), "gamma"),
             nh.from_array(rng.uniform(-1, 1, C).astype(np.float32), "beta"),
             nh.from_array(rng.uniform(-1, 1, C).astype(np.float32), "mean"),
             nh.from_array(rng.uniform(0.5, 2, C).astype(np.float32), "var"),
             nh.from_array(np.array([rows, tokens, C], np.int64), "shape")]
    nodes = [h.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             h.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             h.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"]),
             h.make_node("MatMul", ["xd", "wd"], ["m"]),
             h.make_node("QuantizeLinear", ["m", "ms", "mz"], ["mq"]),
             h.make_node("DequantizeLinear", ["mq", "ms", "mz"], ["md"]),
             h.make_node("Flatten", ["md"], ["f"], axis=2),
             h.make_node("BatchNormalization", ["f", "gamma", "beta", "mean", "var"], ["bn"]),
             h.make_node("Reshape", ["bn", "shape"], ["r"]),
             h.make_node("HardSwish", ["r"], ["a"]),
             h.make_node("QuantizeLinear", ["a", "ys", "yz"], ["aq"]),
             h.make_node("DequantizeLinear", ["aq", "ys", "yz"], ["out"])]
    graph = h.make_graph(nodes, "linear_norm",
                         [h.make_tensor_value_info("x", TensorProto.FLOAT, [rows, tokens, C])],
                         [h.make_tensor_value_info("out", TensorProto.FLOAT,
                                                   [rows, tokens, C])], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def test_batchnorm_between_reshapes_of_a_matmul_output_joins_its_kernel() -> None:
    """LeViT NNCF: 11 BatchNorm binaries and the dequantize reorders before them (238 → 205
    kernels). The BN over [B·N, C] sits between a Flatten and a Reshape that keep C last."""
    model = _linear_norm()
    compiled = compile_model(model)
    kernels = compiled.inspect()["kernels"]
    # one matmul (two without VNNI: compiler/lower/no_vnni.py splits the weights), a 1x1
    # convolution over its rows where oneDNN's matmul is the GEMM (vector_matmul_as_conv)
    assert {k["op"] for k in kernels} in ({"FakeQuantize", "MatMul"},
                                          {"FakeQuantize", "Conv"}), kernels
    assert not [k for k in kernels if k["op"] in ("BatchNormalization", "HardSwish")
                or k["primitive"] == "batch_normalization"], [k["name"] for k in kernels]
    reference = compile_model(model, mode="reference")
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal((6, 5, C)).astype(np.float32)
        assert step_diff(compiled.run({"x": x})["out"],
                         reference.run({"x": x})["out"], S_Y).max_steps <= 1
