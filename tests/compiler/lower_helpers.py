"""Hand-built graphs for the lowering tests, and the two oracles they are checked against.

- ``exact_expected``: what oneDNN computes — the exact integer accumulator
  (runtime/onednn/reference.py) through the composer's attributes
  (runtime/reference/chain.apply_composed). The plan must match it to 0 LSB.
- ``ref_eval``: the graph's meaning — the reference interpreter's op semantics, with
  runtime/reference/fused.evaluate_fused for fused nodes (the chain item by item). The plan
  may differ from it by the composer's float32 re-association: at most 1 LSB, rarely.
"""

from __future__ import annotations

from typing import Any

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pytest
from onnx import helper, numpy_helper

from qfuse.compiler.api import CompiledModel, compile_model
from qfuse.compiler.lower import Options, Plan, lower
from qfuse.compiler.lower.lower_matmul import FLOAT_MATMUL
from qfuse.compiler.lower.no_vnni import EXACT_INT8_ISAS, impl_is_exact
from qfuse.examples import zoo
from qfuse.ir import DType, Graph, Node, Op, QuantParams, TensorInfo
from qfuse.ir.chain import Act, Activation, ChainOp, Fused, Quantize, Residual, Scale, Shift
from qfuse.ir.ops import ConvAttrs, ConvTransposeAttrs, NoAttrs
from qfuse.passes import compose_post_ops
from qfuse.passes.base import PassContext
from qfuse.passes.composer import compose
from qfuse.runtime.executor import Executor
from qfuse.runtime.onednn import effective_cpu_isa
from qfuse.runtime.reference import IMPLS
from qfuse.runtime.reference.chain import apply_composed
from qfuse.runtime.reference.fused import accumulate, evaluate_fused

F32 = np.float32

# Bit-exact int8 expectations hold where oneDNN's dot products are exact (VNNI / AMX) and,
# without VNNI, where the lowering splits the weights (compiler/lower/no_vnni.py, on by
# default); with the split off, u8·s8 pairs saturate in int16 (test_onednn_int8.py).
#: True where the lowering splits int8 nodes into two primitives (no VNNI, no_vnni.py).
SPLITS_INT8 = effective_cpu_isa() not in EXACT_INT8_ISAS and Options().exact_int8
requires_exact_int8 = pytest.mark.skipif(
    effective_cpu_isa() not in EXACT_INT8_ISAS and not Options().exact_int8,
    reason="int8 dot products saturate in int16 on this ISA (no VNNI/AMX, no split)")
#: For tests of the plan's structure (kernel counts, masks): one primitive per int8 node.
one_primitive_per_int8_node = pytest.mark.skipif(
    SPLITS_INT8, reason="without VNNI the int8 nodes are split in two primitives (no_vnni.py)")


def computes_int8_node(kernel: dict[str, Any]) -> bool:
    """A kernel of ``inspect()`` that computes an int8 compute node: on its 8-bit source, or
    (no VNNI) as the float32 matmul over its integer operands (lower_matmul)."""
    return kernel["src_dtype"] in ("u8", "s8") or kernel.get("exact_int8", "").startswith(
        FLOAT_MATMUL)


def float_matmul_copy(kernel: dict[str, Any]) -> bool:
    """A reorder that exists for such a float32 matmul: an operand made float32, the 8-bit
    store of its result."""
    return kernel["primitive"] == "reorder" and FLOAT_MATMUL in kernel.get("note", "")


def ref_eval(graph: Graph, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The reference semantics of ``graph`` (fused nodes through evaluate_fused)."""
    env = dict(feeds)

    def read(name: str) -> np.ndarray | None:
        if not name:
            return None
        data = graph.constant(name)
        return env[name] if data is None else data

    for node in graph.topo_order():
        args = [read(v) for v in node.inputs]
        outs = evaluate_fused(node, args, graph) if node.fused else IMPLS[node.op](node, args)
        for name, array in zip(node.outputs, outs, strict=True):
            env[name] = np.asarray(array).astype(graph.info(name).dtype.np)
    return {name: read(name) for name in graph.outputs}  # type: ignore[misc]


def lower_built(graph: Graph, options: Options | None = None) -> Plan:
    """Lower a hand-built graph: its fused nodes get the composer's attributes first, as the
    pipeline's last pass gives them."""
    compose_post_ops.run(graph, PassContext())
    return lower(graph, options)


def run_plan(graph: Graph, feeds: dict[str, np.ndarray], mode: str = "fused", **options: Any
             ) -> tuple[dict[str, np.ndarray], Plan]:
    plan = lower_built(graph, Options(mode=mode, **options))
    return Executor(plan).run(feeds), plan


def quantize_item(scale: float, zp: int, dtype: DType) -> Quantize:
    """The quantize-only FakeQuantize of ``q = saturate(round(x/s) + zp)`` into ``dtype``."""
    lo, hi = dtype.range
    return Quantize((scale * (lo - zp),), (scale * (hi - zp),), (float(lo),), (float(hi),),
                    256, dtype)


def int_input(graph: Graph, name: str, shape: Sequence[int], dtype: DType, scale: float = 0.05,
              zp: int = 0) -> str:
    graph.add_input(name, TensorInfo(tuple(shape), dtype, QuantParams.make(scale, zp)))
    return name


def out_info(shape: Sequence[int], dtype: DType, scale: float, zp: int) -> TensorInfo:
    quant = QuantParams.make(scale, zp) if dtype.is_integer else None
    return TensorInfo(tuple(shape), dtype, quant)


def conv_out(size: int, k: int, s: int, d: int, pb: int, pe: int) -> int:
    return (size + pb + pe - ((k - 1) * d + 1)) // s + 1


def add_int8_conv(graph: Graph, x: str, out_channels: int, *, kernel: int = 3, stride: int = 1,
                  pads: tuple[int, int, int, int] = (1, 1, 1, 1), dilation: int = 1,
                  group: int = 1, chain: list[ChainOp] | None = None, dst: DType = DType.U8,
                  out_scale: float = 0.05, out_zp: int = 0, residual: str | None = None,
                  seed: int = 0, name: str = "conv", deconv: bool = False,
                  output_padding: int = 0) -> Node:
    """An int8 Conv / ConvTranspose with a fused chain; weights random s8, per-OC scales."""
    rng = np.random.default_rng(seed)
    info = graph.info(x)
    n, c, h, w = info.shape
    assert info.quant is not None
    s_x, zp_x = info.quant.scale[0], info.quant.zero_point[0]
    if deconv:
        wshape = (c, out_channels // group, kernel, kernel)
        oh = (h - 1) * stride + (kernel - 1) * dilation + 1 + output_padding - pads[0] - pads[2]
        ow = (w - 1) * stride + (kernel - 1) * dilation + 1 + output_padding - pads[1] - pads[3]
        attrs = ConvTransposeAttrs((kernel, kernel), (stride, stride), pads,
                                   (dilation, dilation), (output_padding,) * 2, group)
    else:
        wshape = (out_channels, c // group, kernel, kernel)
        oh = conv_out(h, kernel, stride, dilation, pads[0], pads[2])
        ow = conv_out(w, kernel, stride, dilation, pads[1], pads[3])
        attrs = ConvAttrs((kernel, kernel), (stride, stride), pads, (dilation, dilation), group)
    weights = rng.integers(-127, 128, wshape).astype(np.int8)
    wname = graph.unique_name(f"{name}_w")
    graph.add_constant(wname, weights)
    s_w = rng.uniform(0.002, 0.01, out_channels).astype(F32)
    if chain is None:
        chain = [Scale.of(s_x * s_w), Shift.of(rng.uniform(-0.5, 0.5, out_channels)),
                 Activation(Act.RELU)]
        if residual is not None:
            rq = graph.info(residual).quant
            assert rq is not None
            chain.append(Residual(2, rq.scale[0], rq.zero_point[0],
                                  graph.info(residual).dtype))
        if dst.is_integer:
            chain.append(quantize_item(out_scale, out_zp, dst))
    inputs = [x, wname] + ([residual] if residual is not None else [])
    op = Op.CONV_TRANSPOSE if deconv else Op.CONV
    node = graph.add_node(op, inputs, [graph.unique_name(name + "_out")], attrs, name=name,
                          infos=[out_info((n, out_channels, oh, ow), dst, out_scale, out_zp)])
    node.fused = Fused(chain=chain, src_zero_point=zp_x)
    return node


def exact_expected(graph: Graph, node: Node, inputs: list[np.ndarray]) -> np.ndarray:
    """oneDNN's model: exact accumulator, then apply_composed of the composed chain."""
    assert node.fused is not None
    acc = accumulate(node, inputs)  # exact (int64 → int32)
    out = graph.info(node.outputs[0])
    axis = len(out.shape) - 1 if node.op is Op.MATMUL else 1
    composed = compose(node.fused.chain, channels=out.shape[axis], dst_dtype=out.dtype)
    residuals = {item.port: inputs[item.port] for item in node.fused.chain
                 if isinstance(item, Residual)}
    return apply_composed(acc.astype(np.int64), composed, residuals, channel_axis=axis)


def random_int(rng: np.random.Generator, shape: Sequence[int], dtype: DType) -> np.ndarray:
    lo, hi = dtype.range
    return rng.integers(lo, hi + 1, tuple(shape)).astype(dtype.np)


S8, U8 = DType.S8, DType.U8


def matmul_graph(a_shape: tuple[int, ...], b_shape: tuple[int, ...], *, b_const: bool,
                  b_dtype: DType = S8, wei_zp: int = 0, dst: DType = U8,
                  per_column: bool = True, a_dtype: DType = U8
                  ) -> tuple[Graph, dict[str, np.ndarray]]:
    """An int8 MatMul with a fused chain (per-column or per-tensor scale, shift, quantize)."""
    rng = np.random.default_rng(7)
    g = Graph("matmul")
    feeds = {"a": random_int(rng, a_shape, a_dtype)}
    int_input(g, "a", a_shape, a_dtype, 0.02, 9)
    b = random_int(rng, b_shape, b_dtype)
    if b_const:
        g.add_constant("b", b)
    else:
        int_input(g, "b", b_shape, b_dtype, 0.03, wei_zp)
        feeds["b"] = b
    n = b_shape[-1]
    out_shape = np.broadcast_shapes(a_shape[:-2], b_shape[:-2]) + (a_shape[-2], n)
    scale = rng.uniform(1e-4, 3e-4, n if per_column else 1)
    chain = [Scale.of(scale), Shift.of(rng.uniform(-0.3, 0.3, n))]
    if dst.is_integer:
        chain.append(quantize_item(0.01, 60, dst))
    node = g.add_node(Op.MATMUL, ["a", "b"], ["y"], NoAttrs(), name="mm",
                      infos=[out_info(out_shape, dst, 0.01, 60)])
    node.fused = Fused(chain=chain, src_zero_point=9, wei_zero_point=wei_zp)
    g.outputs.append("y")
    return g, feeds


MATMUL_CASES = {
    "2d": {"a_shape": (4, 64), "b_shape": (64, 32), "b_const": True},
    "2d_f32_dst": {"a_shape": (4, 64), "b_shape": (64, 32), "b_const": True, "dst": DType.F32},
    "batched_3d": {"a_shape": (2, 5, 64), "b_shape": (64, 48), "b_const": True},
    "const_u8_weights_zp": {"a_shape": (3, 32), "b_shape": (32, 16), "b_const": True, "b_dtype": U8,
                                "wei_zp": 120},
    "act_x_act_s8": {"a_shape": (2, 3, 8, 16), "b_shape": (2, 3, 16, 8), "b_const": False,
                         "wei_zp": -4, "per_column": False},
    "act_x_act_u8": {"a_shape": (2, 3, 8, 16), "b_shape": (2, 3, 16, 8), "b_const": False,
                         "b_dtype": U8, "wei_zp": 128, "per_column": False},
    # an s8 src (a LayerNorm's output, which keeps s8: no dst zero point there)
    "s8_src": {"a_shape": (1, 6, 64), "b_shape": (64, 32), "b_const": True, "a_dtype": S8},
    "s8_src_act_x_act": {"a_shape": (2, 3, 8, 16), "b_shape": (2, 3, 16, 8), "b_const": False,
                         "a_dtype": S8, "wei_zp": -4, "per_column": False},
}


@dataclass
class Agreement:
    """Per-kernel agreement over a model: integer elements by kind of node, float error."""

    worst: int = 0
    differing: dict[str, int] = field(default_factory=lambda: {"compute": 0, "quantize": 0})
    total: dict[str, int] = field(default_factory=lambda: {"compute": 0, "quantize": 0})
    float_err: float = 0.0

    def identical(self, kind: str) -> float:
        return 1 - self.differing[kind] / max(self.total[kind], 1)


def local_agreement(model: CompiledModel, feeds: dict[str, np.ndarray],
                    into: Agreement) -> None:
    """Every node on the plan's own inputs (a value the plan never materializes, e.g. the
    dequantize half of a requantize reorder, is computed by the reference from its inputs)."""
    graph = model.compiled_graph
    assert graph is not None
    values = model.run_all(feeds, as_planned=True)  # the compiled graph's channel orders
    derived: dict[str, np.ndarray] = {}
    for node in graph.topo_order():
        args = [(values.get(v, derived.get(v, graph.constant(v)))) if v else None
                for v in node.inputs]
        outs = evaluate_fused(node, args, graph) if node.fused else IMPLS[node.op](node, args)
        kind = "quantize" if node.op in (Op.FAKE_QUANTIZE, Op.QUANTIZE_LINEAR) else "compute"
        for name, ref in zip(node.outputs, outs, strict=True):
            if name not in values:
                derived[name] = np.asarray(ref).astype(graph.info(name).dtype.np)
                continue
            got = values[name]
            ref = np.asarray(ref).astype(got.dtype)
            if got.dtype.kind in "iu":
                d = np.abs(got.astype(np.int64) - ref.astype(np.int64))
                into.worst = max(into.worst, int(d.max(initial=0)))
                into.differing[kind] += int(np.count_nonzero(d))
                into.total[kind] += d.size
            else:
                scale = max(1.0, float(np.abs(ref).max(initial=0)))
                into.float_err = max(into.float_err,
                                     float(np.abs(got - ref).max(initial=0)) / scale)


def zoo_values() -> dict[str, np.ndarray]:
    """Every value of the small zoo plans (fused and unfused), keyed name|mode|value; asserts
    that every int8 compute kernel runs on an exact implementation or says how it is exact."""
    values = {}
    for name in zoo.SMALL_ARCHITECTURES:
        model = zoo.quantized_model(name)
        feeds = zoo.sample_inputs(model, n=1, seed=11)[0]
        for mode in ("fused", "unfused"):
            compiled = compile_model(model, mode=mode)
            info = compiled.inspect()
            for kernel in info["kernels"]:
                if kernel["primitive"] in ("convolution", "deconvolution", "matmul") and (
                        kernel["src_dtype"] in ("u8", "s8")):
                    assert impl_is_exact(kernel["impl"]) or kernel.get("exact_int8"), kernel
            for value, array in compiled.run_all(feeds).items():
                values[f"{name}|{mode}|{value}"] = array
    return values


def onnx_qdq(nodes: list[Any], inits: list[Any], src: str, dst: str, scale: float,
             zp: int) -> None:
    """Append an ONNX QuantizeLinear / DequantizeLinear pair ``src`` → ``dst`` (u8, per tensor)
    and its scale and zero point initializers to ``nodes`` and ``inits``."""
    nodes.extend([
        helper.make_node("QuantizeLinear", [src, f"s_{dst}", f"z_{dst}"], [f"{dst}_q"]),
        helper.make_node("DequantizeLinear", [f"{dst}_q", f"s_{dst}", f"z_{dst}"], [dst])])
    inits.extend([numpy_helper.from_array(np.asarray(scale, np.float32), f"s_{dst}"),
                  numpy_helper.from_array(np.asarray(zp, np.uint8), f"z_{dst}")])
