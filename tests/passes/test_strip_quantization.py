"""strip_quantization (the fp32 mode's first pass) and mark_float_compute."""

from __future__ import annotations

import numpy as np

from qfuse.ir import DType, Graph, Op
from qfuse.ir.ops import ConvAttrs, NoAttrs
from qfuse.passes import strip_quantization
from qfuse.passes.base import PassContext, run_pass
from qfuse.runtime.reference import evaluate
from tests.passes.quant_helpers import add, const, dequantize, new_graph, quantize

F32 = np.float32


def _conv_qdq(zp: int) -> Graph:
    """x → Q/DQ → Conv(DQ(s8 weights), DQ(s32 bias)) → Q/DQ → y (ORT's QDQ layout)."""
    g = new_graph((1, 3, 6, 6))
    quantize(g, "x", "xq", 0.05, 128)
    dequantize(g, "xq", "xd", 0.05, 128)
    w = const(g, "w", np.random.default_rng(0).integers(-127, 128, (4, 3, 3, 3)), np.int8)
    dequantize(g, w, "wd", 0.01, 0)
    b = const(g, "b", [100, -50, 0, 7], np.int32)
    dequantize(g, b, "bd", 0.0005, 0, axis=0)
    add(g, Op.CONV, ["xd", "wd", "bd"], "c", ConvAttrs((3, 3), (1, 1), (1, 1, 1, 1), (1, 1)))
    quantize(g, "c", "cq", 0.02, zp)
    dequantize(g, "cq", "y", 0.02, zp)
    g.outputs.append("y")
    return g


def _strip(g: Graph) -> int:
    result = run_pass("strip_quantization", strip_quantization.run, g, PassContext())
    g.verify()
    return result.changed


def test_qdq_pairs_go_and_constants_fold() -> None:
    g = _conv_qdq(zp=100)
    assert _strip(g) > 0
    assert [n.op for n in g.topo_order()] == [Op.CONV]
    assert g.outputs == ["y"]  # the output keeps its name
    conv = g.topo_order()[0]
    assert g.constant(conv.inputs[1]).dtype == F32  # (w - 0)·0.01
    x = np.random.default_rng(1).standard_normal((1, 3, 6, 6)).astype(F32)
    stripped = evaluate(g, {"x": x})["y"]
    assert np.abs(stripped).max() > 0


def test_clamp_at_zero_becomes_a_clip() -> None:
    """zp = qmin after a Conv: ONNX Runtime removed a Relu there; stripping restores it."""
    g = _conv_qdq(zp=0)
    _strip(g)
    ops = [n.op for n in g.topo_order()]
    assert ops == [Op.CONV, Op.CLIP]
    clip = g.topo_order()[1]
    assert clip.attrs.min == 0.0 and np.isclose(clip.attrs.max, 0.02 * 255)
    x = np.random.default_rng(2).standard_normal((1, 3, 6, 6)).astype(F32)
    assert evaluate(g, {"x": x})["y"].min() >= 0


def test_integer_interface_stays() -> None:
    """A quantize producing a graph output is part of the interface: declined, not removed."""
    g = new_graph((2, 3))
    quantize(g, "x", "q", 0.1, 0)
    g.outputs.append("q")
    result = run_pass("strip_quantization", strip_quantization.run, g, PassContext())
    assert result.changed == 0 and len(result.declined) == 1
    assert [n.op for n in g.topo_order()] == [Op.QUANTIZE_LINEAR]


def test_mark_float_compute_moves_the_bias_into_the_chain() -> None:
    g = _conv_qdq(zp=100)
    _strip(g)
    result = run_pass("mark_float_compute", strip_quantization.mark_float_compute, g,
                      PassContext())
    g.verify()
    conv = g.topo_order()[0]
    assert result.changed == 1 and conv.fused is not None and len(conv.inputs) == 2
    assert len(conv.fused.chain) == 1  # Shift(bias)


def test_non_float_matmul_is_not_marked() -> None:
    g = new_graph((2, 4), DType.U8)
    w = const(g, "w", np.ones((4, 3)), np.uint8)
    add(g, Op.MATMUL, ["x", w], "y", NoAttrs())
    g.outputs.append("y")
    assert strip_quantization.mark_float_compute(g, PassContext()) == 0


def _se_block(gate_quantized: bool = False) -> "onnx.ModelProto":
    """NNCF's squeeze-excitation layout: x quantized; GlobalAveragePool(x) → Conv(DQ(w1),
    DQ(b1)) → Relu → Conv(DQ(w2), b2) → Sigmoid → Mul(x, ·) → Q/DQ, the convs in float32
    (no quantizer on the pooled vector), their weights int8 behind DequantizeLinear;
    ``gate_quantized``: the Sigmoid's output quantized too (Q/DQ before the Mul), as NNCF
    does in EfficientNet, MobileNetV3 and RegNet."""
    import onnx
    from onnx import TensorProto
    from onnx import helper as h
    from onnx import numpy_helper as nh

    rng = np.random.default_rng(5)
    c, r = 16, 4
    inits = [nh.from_array(rng.integers(-127, 128, (r, c, 1, 1)).astype(np.int8), "w1"),
             nh.from_array(rng.integers(-127, 128, (c, r, 1, 1)).astype(np.int8), "w2"),
             nh.from_array(rng.integers(-500, 500, r).astype(np.int32), "b1"),
             nh.from_array(rng.uniform(-1, 1, c).astype(np.float32), "b2"),
             nh.from_array(np.array(0.004, np.float32), "sw"),
             nh.from_array(np.array(0.0002, np.float32), "sb"),
             nh.from_array(np.array(0.05, np.float32), "sx"),
             nh.from_array(np.array(128, np.uint8), "zx"),
             nh.from_array(np.array(0.03, np.float32), "sy"),
             nh.from_array(np.array(120, np.uint8), "zy"),
             nh.from_array(np.array(1 / 256, np.float32), "sg")]
    nodes = [h.make_node("QuantizeLinear", ["input", "sx", "zx"], ["xq"]),
             h.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["x"]),
             h.make_node("DequantizeLinear", ["w1", "sw"], ["w1f"]),
             h.make_node("DequantizeLinear", ["w2", "sw"], ["w2f"]),
             h.make_node("DequantizeLinear", ["b1", "sb"], ["b1f"]),
             h.make_node("GlobalAveragePool", ["x"], ["p"]),
             h.make_node("Conv", ["p", "w1f", "b1f"], ["c1"]),
             h.make_node("Relu", ["c1"], ["r1"]),
             h.make_node("Conv", ["r1", "w2f", "b2"], ["c2"]),
             h.make_node("Sigmoid", ["c2"], ["g0" if gate_quantized else "g"]),
             *([h.make_node("QuantizeLinear", ["g0", "sg"], ["gq"]),
                h.make_node("DequantizeLinear", ["gq", "sg"], ["g"])] if gate_quantized else []),
             h.make_node("Mul", ["x", "g"], ["m"]),
             h.make_node("QuantizeLinear", ["m", "sy", "zy"], ["yq"]),
             h.make_node("DequantizeLinear", ["yq", "sy", "zy"], ["out"])]
    shape = [1, c, 7, 7]
    graph = h.make_graph(nodes, "se", [h.make_tensor_value_info("input", TensorProto.FLOAT,
                                                                shape)],
                         [h.make_tensor_value_info("out", TensorProto.FLOAT, shape)], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def test_fused_pipeline_gives_float_convs_their_activations() -> None:
    """A quantized model's float32 convs (NNCF's squeeze-excitation) take their Relu and
    Sigmoid as post-ops in the fused pipeline: two kernels fewer, outputs bit-identical with
    the pass off, within 1 LSB of the reference interpreter."""
    from qfuse.compiler.api import compile_model, import_graph
    from qfuse.compiler.lower import Options, lower
    from qfuse.compiler.modes import run_passes
    from qfuse.runtime.executor import Executor

    model = _se_block()
    compiled = compile_model(model)
    kernels = compiled.inspect()["kernels"]
    convs = [k for k in kernels if k["primitive"] == "convolution"]
    assert len(convs) == 2 and all(k["src_dtype"] == "f32" for k in convs), convs
    assert {"Relu_7", "Sigmoid_9"} <= {a for k in convs for a in k["absorbed"]}
    assert not [k for k in kernels if k["primitive"] == "eltwise" or "ref" in k["impl"]]
    graph = import_graph(model)
    run_passes(graph, "fused", PassContext(disabled_passes=frozenset({"mark_float_compute"})))
    before = Executor(lower(graph, Options(mode="fused")))
    assert len(before.plan.kernels) == len(kernels) + 2
    _bit_identical_within_a_step(model, compiled, before, seed=0)


def test_float_conv_writes_its_quantize_dequantized() -> None:
    """A float32 conv followed by a quantize and its dequantize (NNCF's quantized
    squeeze-excitation gate) writes the float32 values (Q(x) − zp)·s itself: no quantize or
    dequantize kernel, the conv on a jit kernel (a one-value binary post-op: a per-channel
    one puts a 1x1-image conv on ref:any), bit-identical to the unfused mode."""
    from qfuse.compiler.api import compile_model

    model = _se_block(gate_quantized=True)
    compiled = compile_model(model)
    kernels = compiled.inspect()["kernels"]
    assert len(kernels) == len(compile_model(_se_block()).inspect()["kernels"])
    gate = next(k for k in kernels if k["primitive"] == "convolution"
                and any(a.startswith("Sigmoid") for a in k["absorbed"]))
    assert {"QuantizeLinear", "DequantizeLinear"} <= {a.split("_")[0] for a in gate["absorbed"]}
    assert gate["dst_dtype"] == "f32" and "ref" not in gate["impl"], gate
    assert not [k for k in kernels if "ref" in k["impl"]]
    _bit_identical_within_a_step(model, compiled, compile_model(model, mode="unfused"), seed=1)


def _bit_identical_within_a_step(model: "onnx.ModelProto", compiled, other, seed: int) -> None:
    """On three random inputs, ``compiled``'s output equals ``other``'s bit for bit and is
    within one output step (0.03) of the reference interpreter's (its Sigmoid in float64)."""
    from qfuse.compiler.api import compile_model
    from qfuse.runtime.numerics import step_diff

    reference = compile_model(model, mode="reference")
    rng = np.random.default_rng(seed)
    for _ in range(3):
        feeds = {"input": rng.uniform(-4, 4, (1, 16, 7, 7)).astype(F32)}
        out = compiled.run(feeds)["out"]
        np.testing.assert_array_equal(out, other.run(feeds)["out"])
        diff = step_diff(out, reference.run(feeds)["out"], 0.03)
        assert diff.max_steps <= 1 and diff.identical >= 0.99
