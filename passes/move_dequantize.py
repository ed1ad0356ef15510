"""Dequantize moved after Conv / ConvTranspose / MatMul: the int8 compute node (docs/design.md
"Passes" 4, LPT's ConvolutionTransformation / MatMulTransformation).

Pattern: ``Conv(DQ(x_q; sx, zx), DQ(w_q; sw[oc], 0)[, bias])`` (and ConvTranspose, MatMul).
Since the op is linear in each input,

    conv((x_q - zx)·sx, w_q·sw) + b = sx·sw[oc]·conv(x_q - zx, w_q) + b[oc]

so the node reads x_q and w_q directly, computes the exact integer accumulator
``acc = conv(x_q - zx, w_q)`` (zx = ``Fused.src_zero_point``, subtracted before padding: a
padding tap of the float conv is the real 0 = (zx - zx)·sx) and applies the chain
``[Scale(f32(sx)·f32(sw[oc])), Shift(b)]``; its output stays f32 under the same name. For
MatMul with a weight zero point zw: ``(a - za)·sa @ (b - zw)·sb = sa·sb·((a - za) @ (b - zw))``.

Precision: acc is exact; the float graph rounds every dequantized input to float32 and then
accumulates, while the int8 node rounds once, in the scale. Outputs agree to a few float32
ulps, so a following quantization picks the same level except within ulps of a .5 tie
(tests/passes/test_move_dequantize.py measures: within 1 LSB, >= 99.9% identical).

Preconditions (oneDNN 3.x int8, docs/onednn.md), each declined with its reason:
- activation: DQ of a non-constant u8/s8 tensor, per tensor (src scale and zero point mask 0);
  or per channel (NNCF quantizes depthwise inputs so) into a Conv / ConvTranspose whose every
  group reads one input channel: input channel c then reaches only the output channels of
  group c, so ``sx[c]`` joins their weight scales exactly as a per-tensor sx does —
  ``Scale(f32(sx[g(oc)])·f32(sw[oc]))``; or per channel with one scale on every channel into
  any Conv / ConvTranspose: a per-tensor scale (a Concat of tensors NNCF gives one scale,
  unified scales, where one is held as u8 with zero point 128 and another as u8 with zero
  point 0: HGNet's aggregation convs). Per-channel zero points (those, and NNCF's MIXED
  preset and ``model_type=TRANSFORMER``: asymmetric activations) have no oneDNN form (a
  per-channel src zero point runs on ``ref:any`` only), so the node reads x_q with zero
  point 0 and its chain first adds the integer correction ``C = acc − acc₀``:

      acc  = Σ_in-bounds w·(x_q − zx[c])      (a padding tap is the real 0: no term)
      acc₀ = Σ_in-bounds w·x_q                 (oneDNN with src zero point 0 pads with 0)
      C    = −Σ_in-bounds w·zx[c] = −op(zx broadcast over x's shape, w)

  C is computed once by the reference op (int64, exact) on an image of the zero points; it
  varies over the output only where windows cross the padding, so it is stored per output
  channel ``[1, OC, 1, 1]`` when it does not, else whole ``[1, OC, OH, OW]``. The chain is
  ``[TensorOperand(+C), Scale, Shift]``; ``f32(acc₀) + C`` is ``f32(acc)`` exactly while every
  partial sum stays below 2^24 (checked: ``255·Σ|w|`` per output channel), so the rewrite is
  bit-exact with the per-tensor form. The multiply then runs as a post-op (binary_mul), not
  as oneDNN's weight scale: the same single float32 product;
- Conv / ConvTranspose weights: DQ of a constant s8 tensor, zero point 0 (no weight zero
  points), per tensor or per output channel — Conv axis 0; ConvTranspose axis 1 of
  [Cin, Cout/g, k..], whose Cout/g scales repeat per group (output channel g·(Cout/g) + j
  gets scale j, so they are tiled g times). u8 weights, or a non-zero weight zero point
  (ONNX Runtime's ``weight_type=QUInt8``, ``WeightSymmetric`` off), are rewritten exactly
  when every ``w_q − zw`` fits in s8: ``(w_q − zw)·sw`` is the same real weight, as a new s8
  constant with zero point 0 (symmetric u8 weights, zw = 128, always fit); otherwise declined;
- bias: absent, a float constant, or DQ of a constant (ONNX Runtime: int32 with scale
  sx·sw) — evaluated once to float32 (oneDNN adds the bias after the scales, unscaled);
- MatMul B: a constant s8 or u8 per tensor or per column (the last axis: oneDNN's
  weight scale mask 1 << (ndims - 1)), rewritten to zero point 0 as for Conv when every
  ``w_q − zw`` fits in s8 (symmetric u8 weights, ``zw = 128``: ONNX Runtime's
  ``weight_type=QUInt8``), so the MatMul is an s8 one like any other (vector_matmul_as_conv
  takes it); otherwise with one zero point (matmul weight zero point mask 0; lowering shifts
  u8 weights to s8: ``w − 128`` with zero point ``zw − 128``), else declined; or a
  non-constant per-tensor u8/s8 DQ (activation × activation, attention).
"""

from __future__ import annotations

import logging

import numpy as np

from qfuse.ir.chain import Fused, Scale, Shift, TensorOperand
from qfuse.ir.graph import Graph, Node
from qfuse.ir.ops import Op
from qfuse.ir.types import DType, TensorInfo
from qfuse.passes.base import PassContext
from qfuse.passes.quant_utils import DqParams, centered, dq_params, is_op, remove_if_unused
from qfuse.runtime.numerics.rounding import F32_EXACT
from qfuse.runtime.reference import IMPLS
from qfuse.runtime.reference.ops_quant import dequantize_linear

log = logging.getLogger(__name__)

F32 = np.float32
COMPUTE = (Op.CONV, Op.CONV_TRANSPOSE, Op.MATMUL)


class Plan:
    """What the rewrite of one compute node needs, found before anything changes."""

    def __init__(self) -> None:
        self.src = ""
        self.wei = ""
        self.fused = Fused()
        self.dqs: list[Node] = []
        self.wei_data: np.ndarray | None = None  # weights rewritten to s8 (zero point 0)
        self.correction: np.ndarray | None = None  # per-channel zero points: C (docstring)


def _activation(graph: Graph, value: str, what: str, per_channel: bool = False
                ) -> tuple[Node, DqParams] | str:
    dq = graph.producer(value)
    if not is_op(dq, Op.DEQUANTIZE_LINEAR) or graph.constant(dq.inputs[0]) is not None:
        return f"{what} is not dequantized int8"
    p = dq_params(graph, dq)
    if p is None:
        return f"{what} dequantize has a non-constant scale or zero point"
    if not p.dtype.is_quantized:
        return f"{what} is {p.dtype.name.lower()} (want u8/s8)"
    if not p.per_tensor and not (per_channel and p.axis == 1):
        return (f"{what} dequantize is per channel (axis {p.axis}); oneDNN takes one source "
                "scale and zero point")
    return dq, p


def _source_scales(graph: Graph, node: Node, px: DqParams, out_channels: int) -> np.ndarray | str:
    """The source scale of each output channel: one value when per tensor; per channel only
    when every group reads one input channel (depthwise, channel multipliers), which then
    scales exactly the output channels of its group, and every zero point is the same."""
    if px.per_tensor:
        return px.scale.astype(F32)
    if np.all(px.scale == px.scale.flat[0]):  # one scale on every channel: a per-tensor one
        return px.scale[:1].astype(F32)
    group = node.attrs.group
    if px.scale.size != group:
        return (f"activation dequantize is per channel ({px.scale.size} scales) and the conv's "
                f"{group} group(s) read {px.scale.size // max(group, 1)} channels each: a "
                "per-channel source scale folds into the weight scales only when each group "
                "reads one channel; oneDNN takes one source scale")
    return np.repeat(px.scale.astype(F32), out_channels // group)


def _zero_point_correction(graph: Graph, node: Node, zero_points: np.ndarray,
                           weights: np.ndarray) -> np.ndarray | str:
    """C = −op(zero points over x's shape, w), exact (docstring); [1, OC, 1...] when it is
    the same at every output position."""
    x_shape = graph.info(node.inputs[0]).shape
    w = weights.astype(np.int64)
    taps = tuple(range(2, w.ndim))
    per_out = np.abs(w).sum(axis=(1, *taps))  # Conv [OC, C/g, k...]: one output's terms
    if node.op is Op.CONV_TRANSPOSE:  # [C, OC/g, k...]: at most every input and tap
        per_out = np.abs(w).sum(axis=(0, *taps))
    if 255 * int(per_out.max()) >= F32_EXACT:
        return ("activation zero points differ per channel and a partial sum could pass 2^24 "
                "(255·Σ|w|), where float32 would round the correction")
    image = np.broadcast_to(zero_points.astype(np.int64).reshape(
        (1, -1) + (1,) * (len(x_shape) - 2)), (1, *x_shape[1:]))
    probe = Node(node.name, node.op, node.attrs, ["x", "w"], ["y"])
    acc = IMPLS[node.op](probe, [np.ascontiguousarray(image), w])[0].astype(np.int64)
    correction = -acc
    flat = correction.reshape(correction.shape[:2] + (-1,))
    if np.all(flat == flat[:, :, :1]):
        correction = flat[:, :, :1].reshape((1, -1) + (1,) * (correction.ndim - 2))
    return correction.astype(F32)


Weights = tuple[Node, DqParams, np.ndarray | None]  # (dq, params, new s8 data or None)


def _weights(graph: Graph, node: Node, *, u8: bool = False) -> Weights | str:
    dq = graph.producer(node.inputs[1])
    if not is_op(dq, Op.DEQUANTIZE_LINEAR) or graph.constant(dq.inputs[0]) is None:
        return "weights are not a dequantized int8 constant"
    p = dq_params(graph, dq)
    if p is None:
        return "weights dequantize has a non-constant scale or zero point"
    if not p.dtype.is_quantized:
        return f"weights are {p.dtype.name.lower()} (want s8 or u8)"
    if p.dtype is DType.S8 and not np.any(p.zero_point != 0):
        return dq, p, None
    free = _zero_point_free(graph, dq, p)
    if isinstance(free, str) and u8 and len(set(p.zero_point.tolist())) == 1:
        return dq, p, None  # one zero point: the matmul's own (lower_matmul)
    return free


def _zero_point_free(graph: Graph, dq: Node, p: DqParams) -> Weights | str:
    """The weights as s8 with zero point 0, exactly: ``w_q − zw`` when all of it fits in s8
    (the same real weights ``(w_q − zw)·sw``); ``rewrite`` stores it as a new constant."""
    shifted = centered(graph.constant(dq.inputs[0]), p)
    if shifted.min() < -128 or shifted.max() > 127:
        return (f"weights are {p.dtype.name.lower()} with zero point(s) "
                f"{sorted(set(p.zero_point.tolist()))[:4]}: w − zw spans "
                f"[{shifted.min()}, {shifted.max()}], beyond s8 (oneDNN int8 kernels take s8 "
                "weights without zero points)")
    return dq, DqParams(p.scale, np.zeros_like(p.zero_point), p.axis, DType.S8), \
        shifted.astype(np.int8)


def bias_of(graph: Graph, node: Node) -> tuple[np.ndarray | None, Node | None] | str:
    """A Conv's / ConvTranspose's bias as float32 and the dequantize it came from (None, None
    without one), or why it is neither a float constant nor a dequantized one."""
    name = node.inputs[2] if len(node.inputs) > 2 else ""
    if not name:
        return None, None
    data = graph.constant(name)
    if data is not None:
        if data.dtype.kind != "f":
            return f"bias is a {data.dtype} constant (want float or dequantized)"
        return data.astype(F32).ravel(), None
    dq = graph.producer(name)
    if not is_op(dq, Op.DEQUANTIZE_LINEAR):
        return "bias is neither a constant nor a dequantized constant"
    args = [graph.constant(v) if v else None for v in dq.inputs]
    if any(a is None for a, v in zip(args, dq.inputs) if v):
        return "bias dequantize reads non-constant values"
    return dequantize_linear(dq, args)[0].astype(F32).ravel(), dq


def plan_conv(graph: Graph, node: Node) -> Plan | str:
    act = _activation(graph, node.inputs[0], "activation", per_channel=True)
    if isinstance(act, str):
        return act
    wei = _weights(graph, node)
    if isinstance(wei, str):
        return wei
    (x_dq, px), (w_dq, pw, w_data) = act, wei
    if np.any(pw.zero_point != 0):
        return "weight zero point != 0: oneDNN convolution has no weight zero points"
    w_shape = graph.info(w_dq.inputs[0]).shape
    deconv = node.op is Op.CONV_TRANSPOSE
    group = node.attrs.group
    want = 1 if deconv else 0
    if not pw.per_tensor and pw.axis != want:
        return (f"weights are per channel along axis {pw.axis}, not the output-channel "
                f"axis {want}")
    scales = pw.scale
    if deconv and not pw.per_tensor:
        if scales.size != w_shape[1]:
            return f"{scales.size} weight scales for {w_shape[1]} channels per group"
        scales = np.tile(scales, group)
    src_scales = _source_scales(graph, node, px, graph.info(node.outputs[0]).shape[1])
    if isinstance(src_scales, str):
        return src_scales
    bias = bias_of(graph, node)
    if isinstance(bias, str):
        return bias
    plan = Plan()
    plan.src, plan.wei, plan.wei_data = x_dq.inputs[0], w_dq.inputs[0], w_data
    plan.fused.chain.append(Scale.of(src_scales * scales.astype(F32)))
    if bias[0] is not None:
        plan.fused.chain.append(Shift.of(bias[0]))
    plan.fused.src_zero_point = int(px.zero_point[0])
    if len(set(px.zero_point.tolist())) > 1:
        w = w_data if w_data is not None else graph.constant(w_dq.inputs[0])
        correction = _zero_point_correction(graph, node, px.zero_point, w)
        if isinstance(correction, str):
            return correction
        plan.correction = correction
        plan.fused.src_zero_point = 0
        plan.fused.chain.insert(0, TensorOperand(2, "add"))
        plan.fused.notes.append("per-channel source zero points: 0 in the kernel, the "
                                "integer correction added to the accumulator")
    plan.dqs = [x_dq, w_dq] + ([bias[1]] if bias[1] is not None else [])
    return plan


def plan_matmul(graph: Graph, node: Node) -> Plan | str:
    act = _activation(graph, node.inputs[0], "activation")
    if isinstance(act, str):
        return act
    a_dq, pa = act
    b_const = graph.producer(node.inputs[1])
    if is_op(b_const, Op.DEQUANTIZE_LINEAR) and graph.constant(b_const.inputs[0]) is not None:
        wei = _weights(graph, node, u8=True)
        if isinstance(wei, str):
            return wei
        b_dq, pb, b_data = wei
        rank = graph.info(b_dq.inputs[0]).rank
        if not pb.per_tensor and pb.axis != rank - 1:
            return (f"weights are per channel along axis {pb.axis}; oneDNN matmul weight "
                    f"scales are per tensor or along the last axis {rank - 1}")
    else:
        other = _activation(graph, node.inputs[1], "B operand")
        if isinstance(other, str):
            return other
        b_dq, pb = other
        b_data = None
    plan = Plan()
    plan.src, plan.wei, plan.wei_data = a_dq.inputs[0], b_dq.inputs[0], b_data
    plan.fused.chain.append(Scale.of(F32(pa.scale[0]) * pb.scale.astype(F32)))
    plan.fused.src_zero_point = int(pa.zero_point[0])
    plan.fused.wei_zero_point = int(pb.zero_point[0])
    plan.dqs = [a_dq, b_dq]
    return plan


def rewrite(graph: Graph, node: Node, plan: Plan) -> None:
    """Make ``node`` the int8 compute node of ``plan`` (in place: name and output kept)."""
    graph.set_input(node, 0, plan.src)
    if plan.wei_data is not None:
        plan.wei = graph.add_constant(graph.unique_name(f"{plan.wei}@s8"), plan.wei_data).name
    graph.set_input(node, 1, plan.wei)
    while len(node.inputs) > 2:
        graph.set_input(node, len(node.inputs) - 1, "")
        node.inputs.pop()
    if plan.correction is not None:  # read by the chain's TensorOperand at port 2
        name = graph.add_constant(graph.unique_name(f"{node.name}@zero_point_correction"),
                                  plan.correction).name
        node.inputs.append("")
        graph.set_input(node, 2, name)
    plan.fused.absorbed = [o for dq in plan.dqs for o in dq.origin]
    node.fused = plan.fused
    out = node.outputs[0]
    graph.set_info(out, TensorInfo(graph.info(out).shape, graph.info(out).dtype))
    for dq in plan.dqs:
        remove_if_unused(graph, dq)


def run(graph: Graph, ctx: PassContext) -> int:
    changed = 0
    for node in graph.topo_order():
        if node.op not in COMPUTE or node.fused is not None:
            continue
        ctx.visit(node)
        plan = plan_matmul(graph, node) if node.op is Op.MATMUL else plan_conv(graph, node)
        if isinstance(plan, str):
            ctx.decline(node, plan)
            continue
        rewrite(graph, node, plan)
        changed += 1
    if changed:
        graph.remove_unused()
    return changed
