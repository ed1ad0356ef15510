"""fuse_gate_chain (passes/fuse_post_ops.py ``run_gates``, compiler/lower/lower_gate.py):
x·Q(f(x)) with the gate's quantizer kept, as quantize_static writes SiLU and HardSwish, runs as
one binary primitive with post-ops. Bit-exact against the unfused mode (the same chain, one
primitive per operation). Against the same model with the pass off, and against the reference
interpreter, within 1 LSB on near-ties (2 output steps when it happens at an inner quantize of a
coarser scale): the standalone quantize reorders it replaces and the
chain's quantize round ``x·(1/s)`` in different float32 steps, and the products x·g of two
quantized values land on exact ties often (measured: 4 of 576 outputs for x·hardsigmoid(x),
0 for SiLU on these inputs)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as h

from qfuse.compiler.api import import_graph
from qfuse.compiler.lower import Options, lower
from qfuse.compiler.modes import run_passes
from qfuse.ir import Op
from qfuse.ir.chain import Scale
from qfuse.passes.base import PassContext
from qfuse.runtime.executor import Executor
from qfuse.runtime.onednn import Arg, DataType
from qfuse.runtime.numerics import step_diff
from qfuse.runtime.reference import evaluate

S_X, ZP_X = 0.05, 128
S_Y, ZP_Y = 0.03, 20
SHAPE = [2, 8, 6, 6]


def _qdq(name: str, scale: float, zp: int, src: str, dst: str) -> list[onnx.NodeProto]:
    return [h.make_node("QuantizeLinear", [src, f"{name}_s", f"{name}_z"], [f"{name}_q"]),
            h.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [dst])]


def _params(name: str, scale: float, zp: int) -> list[onnx.TensorProto]:
    return [h.make_tensor(f"{name}_s", TensorProto.FLOAT, [], [scale]),
            h.make_tensor(f"{name}_z", TensorProto.UINT8, [], [zp])]


def _model(gate: list[onnx.NodeProto], after: list[onnx.NodeProto], y: str,
           inputs: tuple[tuple[str, list[int]], ...] = ()) -> onnx.ModelProto:
    """input → Q/DQ → x; ``gate`` computes g (its own Q/DQ inside); m = x·g; ``after`` from m
    to ``y``; y → Q/DQ → out."""
    inits = [*_params("x", S_X, ZP_X), *_params("y", S_Y, ZP_Y), *_params("g", 1 / 255, 0),
             *_params("a", 6 / 255, 0), *_params("m", 0.04, 30),
             h.make_tensor("three", TensorProto.FLOAT, [], [3.0]),
             h.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
             h.make_tensor("six", TensorProto.FLOAT, [], [6.0])]
    nodes = [*_qdq("x", S_X, ZP_X, "input", "x"), *gate,
             h.make_node("Mul", ["x", "g"], ["m"]), *after, *_qdq("y", S_Y, ZP_Y, y, "out")]
    graph = h.make_graph(nodes, "gate", [h.make_tensor_value_info(name, TensorProto.FLOAT, shape)
                                         for name, shape in (("input", SHAPE), *inputs)],
                         [h.make_tensor_value_info("out", TensorProto.FLOAT, SHAPE)], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


CASES = {
    # SiLU (YOLOv8): x·Q(sigmoid(x))
    "silu": ([h.make_node("Sigmoid", ["x"], ["s"]), *_qdq("g", 1 / 255, 0, "s", "g")], [], "m"),
    # HardSwish as x·Q(hardsigmoid(x))
    "x_hardsigmoid": ([h.make_node("HardSigmoid", ["x"], ["s"], alpha=1 / 6, beta=0.5),
                       *_qdq("g", 1 / 255, 0, "s", "g")], [], "m"),
    # HardSwish as paddle2onnx writes it (PP-OCR): x·Q(clip(x + 3, 0, 6)), Q/DQ, then /6
    "x_relu6_div6": ([h.make_node("Add", ["x", "three"], ["a"]),
                      h.make_node("Clip", ["a", "zero", "six"], ["c"]),
                      *_qdq("a", 6 / 255, 0, "c", "g")],
                     [*_qdq("m", 0.04, 30, "m", "md"), h.make_node("Div", ["md", "six"], ["d"])],
                     "d"),
    # a squeeze-excitation gate from another tensor, then the residual: x + x·Q(se)
    # (PP-OCRv4 det's RSE layers): Mul and Add of run-time tensors as binary post-ops
    "se_residual": ([h.make_node("Sigmoid", ["se_in"], ["s"]), *_qdq("g", 1 / 255, 0, "s", "g")],
                    [*_qdq("m", 0.04, 30, "m", "md"), h.make_node("Add", ["md", "x"], ["d"])],
                    "d", (("se_in", [SHAPE[0], SHAPE[1], 1, 1]),)),
}


# the plan before fuse_gate_chain: fuse_fake_quantize off too, or it would take some of the
# quantize → dequantize pairs a gate chain takes (one f32 kernel each)
WITHOUT_GATES = frozenset({"fuse_gate_chain", "fuse_fake_quantize"})


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray], mode: str = "fused",
         disabled: frozenset[str] = frozenset()) -> tuple[np.ndarray, list]:
    graph = import_graph(model)
    run_passes(graph, mode, PassContext(disabled_passes=disabled))
    plan = lower(graph, Options(mode=mode))
    return Executor(plan).run(feeds)["out"], plan.kernels


@pytest.mark.parametrize("case", sorted(CASES))
def test_gate_is_one_kernel_and_bit_exact(case: str) -> None:
    model = _model(*CASES[case])
    rng = np.random.default_rng(3)
    feeds = {i.name: rng.uniform(-6, 6, [d.dim_value for d in i.type.tensor_type.shape.dim])
             .astype(np.float32) for i in model.graph.input}
    fused, kernels = _run(model, feeds)
    before, old = _run(model, feeds, disabled=WITHOUT_GATES)
    # one step at an inner quantize (scale 0.04) is up to two of the output's (0.03)
    bound = 2 if case in ("x_relu6_div6", "se_residual") else 1
    for other in (before, evaluate(import_graph(model), feeds)["out"]):
        steps, identical = step_diff(np.rint(fused / S_Y), np.rint(other / S_Y))
        assert steps <= bound and identical >= 0.99, (steps, identical)
    gates = [k for k in kernels if k.kind == "binary" and k.info.absorbed
             and any("Mul" in a for a in k.info.absorbed)]
    assert len(gates) == 1, [(k.name, k.kind) for k in kernels]
    # the SE gate's own sigmoid → quantize stays: on a 2×C×1×1 batch a binary primitive
    # would meet oneDNN's per-channel post-op bug (single_pixel_batch, docs/onednn.md)
    assert sum(k.kind == "eltwise" for k in kernels) == (case == "se_residual")
    assert len(kernels) <= len(old) - 4, (len(kernels), len(old))
    unfused, _ = _run(model, feeds, mode="unfused")
    np.testing.assert_array_equal(fused, unfused)


def test_a_lone_activation_then_quantize_is_one_kernel() -> None:
    """sigmoid(x) → Q → DQ read by float ops only (m = g·g): one kernel for the activation,
    its quantize and dequantize (fold_float_dequantize), the Mul's chain then reads g in
    float32; bit-identical with the pass off and unfused; 3 kernels of 8 (the input's
    quantize and dequantize one more, fuse_fake_quantize)."""
    model = _model(*CASES["silu"])
    for node in model.graph.node:
        if node.op_type == "Mul":
            node.input[0] = "g"  # m = g·g: no second tensor, the chain is g's own
    graph = import_graph(model)
    run_passes(graph, "fused", PassContext())
    (sigmoid,) = [n for n in graph.topo_order() if n.op is Op.SIGMOID]
    assert sigmoid.fused is not None
    assert isinstance(sigmoid.fused.chain[-1], Scale) and sigmoid.fused.chain[-1].exact
    fused_ops = [n.op for n in graph.topo_order() if n.fused is not None and n.op is not Op.CONV]
    # the input's quantize and dequantize, read by the Sigmoid in float32: one kernel too
    # (fuse_fake_quantize)
    assert fused_ops == [Op.FAKE_QUANTIZE, Op.SIGMOID, Op.MUL], fused_ops
    rng = np.random.default_rng(3)
    feeds = {"input": rng.uniform(-6, 6, SHAPE).astype(np.float32)}
    fused, kernels = _run(model, feeds)
    before, old = _run(model, feeds, disabled=WITHOUT_GATES)
    assert (len(kernels), len(old)) == (3, 8), ([k.name for k in kernels],
                                               [k.name for k in old])
    np.testing.assert_array_equal(fused, before)
    np.testing.assert_array_equal(fused, _run(model, feeds, mode="unfused")[0])


def _requantize_model(op: onnx.NodeProto, inits: list[onnx.TensorProto]) -> onnx.ModelProto:
    """input → Q/DQ → x → ``op`` → m → Q/DQ → Relu → out: an elementwise op between
    quantizers (the Relu reads the dequantized value in float32, as a next layer would)."""
    nodes = [*_qdq("x", S_X, ZP_X, "input", "x"), op, *_qdq("y", S_Y, ZP_Y, "m", "md"),
             h.make_node("Relu", ["md"], ["out"])]
    graph = h.make_graph(nodes, "requantize",
                         [h.make_tensor_value_info("input", TensorProto.FLOAT, SHAPE)],
                         [h.make_tensor_value_info("out", TensorProto.FLOAT, SHAPE)],
                         [*_params("x", S_X, ZP_X), *_params("y", S_Y, ZP_Y), *inits])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


REQUANTIZE = {
    # attention's q·(1/√d) between quantize_static's quantizers (ViT, BERT, Swin)
    "mul_scalar": (h.make_node("Mul", ["x", "c"], ["m"]),
                   [h.make_tensor("c", TensorProto.FLOAT, [], [0.35])]),
    # a per-channel affine (a decomposed BatchNorm / LayerNorm's β on channels)
    "add_per_channel": (h.make_node("Add", ["x", "c"], ["m"]),
                        [h.make_tensor("c", TensorProto.FLOAT, [1, 8, 1, 1],
                                       np.linspace(-1, 1, 8).tolist())]),
    "sigmoid": (h.make_node("Sigmoid", ["x"], ["m"]), []),
}


@pytest.mark.parametrize("case", sorted(REQUANTIZE))
def test_op_between_quantizers_reads_the_8_bit_source(case: str) -> None:
    """DQ → f(x) → Q: one binary primitive from u8 to u8 (q − zp, linear(s), f, quantize)
    instead of the dequantize reorder, the op and the quantize; bit-exact against the same
    model with the pass off and against the unfused mode, within 1 LSB of the reference
    interpreter (sigmoid: oneDNN's formula against float64, ulps apart)."""
    model = _requantize_model(*REQUANTIZE[case])
    rng = np.random.default_rng(4)
    feeds = {"input": rng.uniform(-6, 6, SHAPE).astype(np.float32)}
    fused, kernels = _run(model, feeds)
    before, old = _run(model, feeds, disabled=WITHOUT_GATES)
    ops = [k for k in kernels if k.info.absorbed and any(a.startswith(("Mul", "Add", "Sigmoid"))
                                                         for a in k.info.absorbed)]
    assert len(ops) == 1 and ops[0].kind == "binary", [(k.name, k.kind) for k in kernels]
    pd = ops[0].primitive.pd
    assert (pd.arg_md(Arg.SRC_0).dtype, pd.arg_md(Arg.DST).dtype) == (DataType.u8, DataType.u8)
    assert pd.impl_name.startswith("jit"), pd.impl_name
    assert any(a.startswith("DequantizeLinear") for a in ops[0].info.absorbed)
    assert len(kernels) == len(old) - 2, ([k.name for k in kernels], [k.name for k in old])
    np.testing.assert_array_equal(fused, before)
    unfused, _ = _run(model, feeds, mode="unfused")
    np.testing.assert_array_equal(fused, unfused)
    steps, identical = step_diff(np.rint(fused / S_Y),
                                 np.rint(evaluate(import_graph(model), feeds)["out"] / S_Y))
    assert steps <= 1 and identical >= 0.99, (steps, identical)


def test_op_between_quantizers_with_a_float_output_stays() -> None:
    """Without the quantize after it the node would write f32 from an 8-bit source, which
    oneDNN's jit binary does not do: nothing changes."""
    op, inits = REQUANTIZE["mul_scalar"]
    model = _requantize_model(op, inits)
    for _ in range(3):  # Q, DQ, Relu
        model.graph.node.remove(model.graph.node[-1])
    model.graph.node[-1].output[0] = "out"  # the Mul writes the graph output
    graph = import_graph(model)
    run_passes(graph, "fused", PassContext())
    assert not [n for n in graph.topo_order() if n.op is Op.MUL and n.fused is not None]


def _add_kernel_bit_exact(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto],
                          shape: list[int], rng: np.random.Generator) -> tuple[object, int]:
    """'input' → ``nodes`` → 'out', run fused, with fuse_gate_chain off and unfused: all three
    bit-identical, no ref: kernel. Returns the one binary kernel absorbing the Add and how
    many kernels the pass saved."""
    graph = h.make_graph(nodes, "add", [h.make_tensor_value_info("input", TensorProto.FLOAT,
                                                                 shape)],
                         [h.make_tensor_value_info("out", TensorProto.FLOAT, shape)], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    feeds = {"input": rng.uniform(-6, 6, shape).astype(np.float32)}
    fused, kernels = _run(model, feeds)
    before, old = _run(model, feeds, disabled=WITHOUT_GATES)
    add = [k for k in kernels if any(a.startswith("Add") for a in k.info.absorbed)]
    assert len(add) == 1 and add[0].kind == "binary", [(k.name, k.kind) for k in kernels]
    assert not [k.name for k in kernels
                if k.primitive is not None and "ref" in k.primitive.pd.impl_name]
    np.testing.assert_array_equal(fused, before)
    unfused, _ = _run(model, feeds, mode="unfused")
    np.testing.assert_array_equal(fused, unfused)
    return add[0], len(old) - len(kernels)


def test_broadcast_operand_quantized_then_read_by_softmax() -> None:
    """Swin's and MaxViT's attention scores plus their relative position bias (a quantized
    constant [1, H, N, N] broadcast over the windows), quantized, then dequantized for the
    Softmax: one binary primitive writes the dequantized float32 values (the quantize and its
    dequantize as post-ops) instead of the Add, the quantize and the dequantize. Bit-exact with
    the pass off and with the unfused mode."""
    rng = np.random.default_rng(9)
    shape, operand = [4, 3, 7, 7], [1, 3, 7, 7]
    bias = rng.integers(-128, 128, operand).astype(np.int8)
    inits = [*_params("x", S_X, ZP_X), *_params("y", S_Y, ZP_Y),
             h.make_tensor("b_q", TensorProto.INT8, operand, bias.ravel().tolist()),
             h.make_tensor("b_s", TensorProto.FLOAT, [], [0.02]),
             h.make_tensor("b_z", TensorProto.INT8, [], [0])]
    nodes = [*_qdq("x", S_X, ZP_X, "input", "x"),
             h.make_node("DequantizeLinear", ["b_q", "b_s", "b_z"], ["b"]),
             h.make_node("Add", ["x", "b"], ["m"]), *_qdq("y", S_Y, ZP_Y, "m", "md"),
             h.make_node("Softmax", ["md"], ["out"], axis=-1)]
    add, saved = _add_kernel_bit_exact(nodes, inits, shape, rng)
    assert len(add.info.absorbed) == 3, add.info.absorbed  # Add, Q, DQ
    assert add.primitive.pd.dst_md.dtype == DataType.f32
    assert saved == 3  # two here, and the input's quantize and dequantize are one kernel


@pytest.mark.parametrize("shape,operand", [
    ([1, 10, 16], [1, 1, 16]),  # a LayerNorm's γ on [N, T, C] (decomposed, paddle2onnx)
    ([1, 4, 3, 7, 7], [1, 4, 1, 7, 7]),  # Swin's shifted-window mask, broadcast over heads
    ([1, 10, 16], [16]),  # γ of lower rank, as paddle2onnx writes it (padded to [1, 1, 16])
    ([1, 4, 20], [1, 20]),  # YOLOv8's anchor strides: dim 1 of [1, 20] is not the channels
])
def test_broadcast_constant_is_the_binary_primitives_own_operand(shape, operand) -> None:
    """x ∘ C then a quantize, C a constant broadcast along axes other than the channels: one
    binary primitive x ∘ C with the quantize as post-ops (oneDNN's binary post-op would run
    such a broadcast on ref:any; the primitive's own operand does not, or C is stored
    broadcast where it would). Bit-exact with the pass off (the standalone op and quantize)
    and with the unfused mode."""
    rng = np.random.default_rng(5)
    c = h.make_tensor("c", TensorProto.FLOAT, operand,
                      rng.uniform(-2, 2, operand).astype(np.float32).ravel().tolist())
    nodes = [*_qdq("x", S_X, ZP_X, "input", "x"), h.make_node("Add", ["x", "c"], ["m"]),
             *_qdq("y", S_Y, ZP_Y, "m", "md"), h.make_node("Relu", ["md"], ["out"])]
    add, saved = _add_kernel_bit_exact(
        nodes, [*_params("x", S_X, ZP_X), *_params("y", S_Y, ZP_Y), c], shape, rng)
    assert add.primitive.pd.impl_name.startswith("jit"), add.primitive.pd.impl_name
    assert "the primitive's own" in add.info.post_op_details[0]
    assert add.info.post_ops[1:3] == ["binary_div", "eltwise_round"]  # then the quantize
    assert saved == 2  # one here, and the input's quantize and dequantize are one kernel


@pytest.mark.parametrize("operand,why", [
    ([2, 8, 6, 6], "dequantizes the second run-time operand"),  # a residual of two 8-bit tensors
    ([1, 8, 1, 6], "dequantizes the source"),  # Swin's shifted-window mask, computed at run time
])
def test_dequantized_operand_of_a_binary_chain_says_why(operand, why) -> None:
    """x + r, both dequantized 8-bit run-time tensors, then a quantize: the binary primitive
    reads one of them as its 8-bit source (or, when r broadcasts along other axes than the
    channels, r as its own operand and x in float32); `inspect` names the dequantize that stays
    and why, not "no pass matched"."""
    from qfuse.compiler.api import compile_model

    inits = [*_params("x", S_X, ZP_X), *_params("y", S_Y, ZP_Y), *_params("r", 0.07, 100)]
    # x and r dequantized from 8-bit inputs (a quantize of a float input would make its pair
    # one float32 kernel, fuse_fake_quantize, and leave no dequantize to explain)
    nodes = [h.make_node("DequantizeLinear", ["input", "x_s", "x_z"], ["x"]),
             h.make_node("DequantizeLinear", ["other", "r_s", "r_z"], ["r"]),
             h.make_node("Add", ["x", "r"], ["m"]), *_qdq("y", S_Y, ZP_Y, "m", "out")]
    graph = h.make_graph(nodes, "operand", [
        h.make_tensor_value_info("input", TensorProto.UINT8, SHAPE),
        h.make_tensor_value_info("other", TensorProto.UINT8, operand)],
        [h.make_tensor_value_info("out", TensorProto.FLOAT, SHAPE)], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    reasons = {d["node"]: d["reason"] for d in compile_model(model).inspect()["not_fused"]}
    assert not [n for n, r in reasons.items() if r == "no pass matched"], reasons
    assert any(r.startswith(why) for r in reasons.values()), reasons


def test_dequantized_operand_also_requantized_says_why() -> None:
    """YOLOv8's C2f: a dequantized map r both added inside a binary chain (x + r → Q) and
    requantized at another scale (into the Concat): the dequantize stays for the chain's
    float32 operand, the quantize reading it requantizes those values; `inspect` says so."""
    from qfuse.compiler.api import compile_model

    inits = [*_params("x", S_X, ZP_X), *_params("y", S_Y, ZP_Y), *_params("r", 0.07, 100),
             *_params("c", 0.09, 90)]
    nodes = [*_qdq("x", S_X, ZP_X, "input", "x"), *_qdq("r", 0.07, 100, "other", "r"),
             h.make_node("Add", ["x", "r"], ["m"]), *_qdq("y", S_Y, ZP_Y, "m", "out"),
             *_qdq("c", 0.09, 90, "r", "out2")]
    graph = h.make_graph(nodes, "operand_requantized", [
        h.make_tensor_value_info("input", TensorProto.FLOAT, SHAPE),
        h.make_tensor_value_info("other", TensorProto.FLOAT, SHAPE)],
        [h.make_tensor_value_info("out", TensorProto.FLOAT, SHAPE),
         h.make_tensor_value_info("out2", TensorProto.FLOAT, SHAPE)], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    reasons = {d["node"]: d["reason"] for d in compile_model(model).inspect()["not_fused"]}
    assert not [n for n, r in reasons.items() if r == "no pass matched"], reasons
    assert any(r.startswith("dequantizes the second run-time operand")
               and r.endswith("requantize those float32 values)") for r in reasons.values()), \
        reasons


def _fewer_kernels_bit_exact(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto],
                             shape: list[int], rng: np.random.Generator, opset: int) -> list:
    """'input' → ``nodes`` → 'out' fused: fewer kernels than with fuse_gate_chain off, none on
    ``ref``, bit-identical to that plan and to the unfused mode. Returns the fused kernels."""
    graph = h.make_graph(nodes, "chain", [h.make_tensor_value_info(
        "input", TensorProto.FLOAT, shape)], [h.make_tensor_value_info(
            "out", TensorProto.FLOAT, shape)], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
    feeds = {"input": rng.uniform(-6, 6, shape).astype(np.float32)}
    fused, kernels = _run(model, feeds)
    before, old = _run(model, feeds, disabled=WITHOUT_GATES)
    assert not [k.name for k in kernels
                if k.primitive is None or "ref" in k.primitive.pd.impl_name]
    assert len(kernels) < len(old)
    np.testing.assert_array_equal(fused, before)
    unfused, _ = _run(model, feeds, mode="unfused")
    np.testing.assert_array_equal(fused, unfused)
    return kernels


@pytest.mark.parametrize("op", ["Div", "Sub", "Sub+residual"])
def test_two_run_time_tensors_divided_then_quantized_are_one_kernel(op: str) -> None:
    """F.normalize as XCiT's and Swin-V2's attention write it for q and k: x / max(‖x‖₂, ε)
    along the tokens (a run-time operand broadcast along the last dim), then a quantize; and
    x − mean(x) alike: one binary primitive x ∘ r with the quantize as post-ops, where the
    Div / Sub and its quantize were two kernels. Then a residual Add of x (PoolFormer's and
    FastViT's ``x + (pool(x) − x)``): x a binary post-op operand too (a binary primitive
    takes no sum post-op). Bit-exact with the pass off and with the unfused mode."""
    residual = op.endswith("+residual")
    op = op.removesuffix("+residual")
    shape = [1, 4, 8, 20]
    rng = np.random.default_rng(11)
    inits = [*_params("x", S_X, ZP_X), *_params("y", S_Y, ZP_Y),
             h.make_tensor("eps", TensorProto.FLOAT, [], [1e-12]),
             h.make_tensor("axes", TensorProto.INT64, [1], [-1])]
    inits += _params("n", 0.1, 0)
    # NNCF quantizes the clipped norm (Q/DQ): its Clip's kernel then writes the dequantized
    # float32 values the Div reads, no dequantize kernel of its own
    r = ([h.make_node("ReduceL2", ["x", "axes"], ["n"], keepdims=1),
          h.make_node("Clip", ["n", "eps"], ["c"]), *_qdq("n", 0.1, 0, "c", "r")]
         if op == "Div" else [h.make_node("ReduceMean", ["x", "axes"], ["r"], keepdims=1)])
    nodes = [*_qdq("x", S_X, ZP_X, "input", "x"), *r, h.make_node(op, ["x", "r"], ["m"]),
             *_qdq("y", S_Y, ZP_Y, "m", "md")]
    if residual:
        inits += _params("z", 0.07, 3)
        nodes += [h.make_node("Add", ["md", "x"], ["a"]), *_qdq("z", 0.07, 3, "a", "md2")]
    nodes.append(h.make_node("Relu", ["md2" if residual else "md"], ["out"]))
    kernels = _fewer_kernels_bit_exact(nodes, inits, shape, rng, opset=18)
    [kernel] = [k for k in kernels if any(a.startswith(op) for a in k.info.absorbed)]
    assert kernel.kind == "binary" and len(kernel.info.absorbed) >= 2, kernel.info.absorbed
    if op == "Div":  # the norm's dequantize (node 5) is the Clip's: no kernel of its own
        [clip] = [k for k in kernels if "Clip_3" in k.info.absorbed]
        assert "DequantizeLinear_5" in clip.info.absorbed, clip.info.absorbed


def test_a_dequantized_constant_first_operand_goes_second() -> None:
    """ResMLP's layer scale as quantize_static writes it: Mul(DQ(γ_q), x), γ along the last
    dim of [N, T, C], the constant first: the same chain as x·γ (the binary primitive's own
    broadcast operand, then the quantize), one kernel instead of the Mul and its quantize."""
    rng = np.random.default_rng(6)
    shape = [1, 10, 16]
    gamma = rng.integers(-100, 100, [16]).astype(np.int8)
    inits = [*_params("x", S_X, ZP_X), *_params("y", S_Y, ZP_Y),
             h.make_tensor("g_q", TensorProto.INT8, [16], gamma.tolist()),
             h.make_tensor("g_s", TensorProto.FLOAT, [], [0.01]),
             h.make_tensor("g_z", TensorProto.INT8, [], [0])]
    nodes = [*_qdq("x", S_X, ZP_X, "input", "x"),
             h.make_node("DequantizeLinear", ["g_q", "g_s", "g_z"], ["g"]),
             h.make_node("Mul", ["g", "x"], ["m"]), *_qdq("y", S_Y, ZP_Y, "m", "md"),
             h.make_node("Relu", ["md"], ["out"])]
    kernels = _fewer_kernels_bit_exact(nodes, inits, shape, rng, opset=17)
    [mul] = [k for k in kernels if "Mul_3" in k.info.absorbed]
    assert "QuantizeLinear_4" in mul.info.absorbed, mul.info.absorbed
