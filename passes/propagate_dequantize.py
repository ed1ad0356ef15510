"""Move DequantizeLinear past precision-preserving ops so int8 data flows through them
(docs/design.md, pass 4; LPT's MoveDequantizationAfter for data movement and pooling).

Pattern: an op whose data input is ``DQ(q)`` (q an integer activation, not a constant).
Rewrite: the op reads q (its outputs become integers with the inferred QuantParams, see
ir/shapes) and a new DQ after it produces the op's float outputs under their old names. The
old DQ stays when it has other readers. Each rule, and why it is exact:

- Reshape, Flatten, Transpose, Squeeze, Unsqueeze, Slice, Split, Identity: move values,
  ``op(DQ(q)) = DQ(op(q))`` element by element. A per-channel DQ needs its axis to survive
  (ir/shapes tracks it: Transpose permutes it, Slice/Split select channels; Reshape/Flatten
  merging the channel dim lose it → declined).
- MaxPool: ``max((q_i - zp)·s) = (max(q_i) - zp)·s`` when s > 0 (x ↦ (x - zp)·s increasing);
  padding taps are ignored by max. Per channel along axis 1 is fine.
- ReduceMax / ReduceMin: the same argument (min likewise), per tensor only (ir/shapes drops a
  per-axis quantization through a reduction, which declines the move).
- Resize nearest: picks input elements. Linear interpolation is not precision-preserving.
- Pad (constant, value v): ``pad(DQ(q), v) = DQ(pad(q, v_q))`` with v_q = round(v/s) + zp,
  required exact ((v_q - zp)·s == v in float32) and in the type's range (v = 0 → v_q = zp).
  Reflect/edge copy elements (the channel axis must not be padded when per channel).
- Concat: inputs all DQ with the same parameters → one DQ after an integer Concat
  (``concat(DQ(q_i)) = DQ(concat(q_i))``). Otherwise, when the Concat's output is read only by
  a quantize-only FakeQuantize F: every input becomes F(input_i) and the Concat is integer
  with F's type — exact, F is elementwise, so F(concat(x_i)) = concat(F(x_i)). An input
  that is a DQ then reads DQ → F, a requantize pair (eliminate_requantize drops the
  identical ones; the rest are lowered as reorders with scales). Otherwise, when every
  input is a DQ of an 8-bit tensor, per tensor or per channel along the concat axis: an
  integer Concat and one DQ per channel along that axis whose scale and zero point vectors
  are the inputs' laid end to end — exact, each channel keeps its own (q - zp)·s (LPT's
  ConcatTransformation). With u8 and s8 inputs together the Concat is u8 and each s8 input
  is re-encoded once, q + 128 with zero point + 128 (the same values; a quantize-only
  FakeQuantize with the same scale, which the producer's store absorbs). Readers take the
  per-channel DQ as post-ops (passes/fuse_post_ops.py, a chain's 8-bit source). DenseNet-121
  NNCF (a ReLU's u8 output beside the convolutions' s8 ones in every dense block): 310 → 252
  kernels, float32 Concats and their dequantize kernels gone, 7.5 → 6.5 ms on a 2-core AVX-512
  VNNI EPYC; GoogLeNet NNCF 88 → 83; outputs bit-identical. This form is also taken before
  the requantizing one when two or more inputs would each need a requantize kernel no
  producer absorbs (their integers have other readers: quantize_static's DenseNet, every
  feature map entering every later Concat of its block at that Concat's scale): one
  per-channel requantize of the Concat's output instead (compiler/lower/lower_quant.py).
  DenseNet-121 QDQ 836 → 313 kernels, 8.5–11.6 → 6.9 ms; YOLOv8n QDQ 207 → 203.
- AveragePool / GlobalAveragePool followed by a quantize-only FakeQuantize F (its only
  reader), TPU-MLIR quantization chapter: ``y = F(avg((q - zx)·sx)) = F(sx·avg(q - zx))`` → one AVG_POOL node
  reading q with ``Fused(chain=[Scale(sx), Quantize(F)], src_zero_point=zx)`` and F's output.
  The zero point is subtracted before the window sum, so a padding tap is the real 0, as in
  the float op, with or without count_include_pad. oneDNN's int8 pooling has no source zero
  point: the lowering must fold zx as ``avg(q) - zx``, which equals avg(q - zx) only when
  every counted tap is real — so count_include_pad with zx != 0 and padding is declined.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from qfuse.ir.chain import Fused, Quantize, Scale
from qfuse.ir.graph import Graph, Node
from qfuse.ir.ops import Op, PadAttrs, PadMode, PoolAttrs, ResizeMode
from qfuse.ir.types import DType, QuantParams, TensorInfo
from qfuse.passes.base import PassContext
from qfuse.passes.decompose_fake_quantize import channel_vector
from qfuse.passes.qdq_to_fake_quantize import add_onnx_quantize
from qfuse.passes.quant_utils import (
    DqParams,
    add_dequantize,
    add_fake_quantize,
    dq_params,
    fq_ranges,
    infer_into,
    is_op,
    quantize_only,
    range_axis,
    readers,
    rebuild,
    remove_if_unused,
)

log = logging.getLogger(__name__)

F32 = np.float32
LAYOUT = (Op.RESHAPE, Op.FLATTEN, Op.TRANSPOSE, Op.SQUEEZE, Op.UNSQUEEZE, Op.SLICE, Op.SPLIT,
          Op.IDENTITY, Op.MAX_POOL, Op.GLOBAL_MAX_POOL, Op.RESIZE, Op.PAD, Op.REDUCE_MAX,
          Op.REDUCE_MIN, Op.DEPTH_TO_SPACE)


def dequantize_of(graph: Graph, value: str) -> tuple[Node, DqParams] | None:
    """(DQ node, its parameters) when ``value`` is a DQ of a non-constant integer tensor."""
    dq = graph.producer(value)
    if not is_op(dq, Op.DEQUANTIZE_LINEAR) or graph.constant(dq.inputs[0]) is not None:
        return None
    params = dq_params(graph, dq)
    return None if params is None else (dq, params)


def _layout_check(graph: Graph, op: Node, p: DqParams) -> str | None:
    """Why ``op`` cannot carry the integer values of a DQ with ``p``, or None."""
    if op.op in (Op.MAX_POOL, Op.GLOBAL_MAX_POOL, Op.REDUCE_MAX, Op.REDUCE_MIN) and np.any(
            p.scale <= 0):
        return "dequantize scale <= 0: max does not commute with a decreasing map"
    if op.op is Op.RESIZE and op.attrs.mode is not ResizeMode.NEAREST:
        return f"Resize {op.attrs.mode.value} interpolates (only nearest moves values)"
    if op.op is Op.PAD and not p.per_tensor:
        attrs: PadAttrs = op.attrs
        rank = graph.info(op.inputs[0]).rank
        if attrs.pads[p.axis] or attrs.pads[rank + p.axis]:
            return "per-channel dequantize before a Pad along its channel axis"
        # a constant 0 is the zero point in every channel: one padding value when they agree
        # (NNCF's per-channel inputs of depthwise convolutions, all zero points 0)
        if attrs.mode is PadMode.CONSTANT and (attrs.value != 0.0
                                               or p.common_zero_point is None):
            return ("per-channel dequantize before a Pad whose value is not 0 in one zero "
                    "point (padding values need one integer)")
    return None


def _pad_value(attrs: PadAttrs, p: DqParams) -> float | str:
    """The pad value in the quantized domain, or why there is none."""
    s, zp = F32(p.scale[0]), int(p.zero_point[0])
    v = F32(attrs.value)
    vq = zp + int(np.rint(v / s))
    lo, hi = p.dtype.range
    if not lo <= vq <= hi or F32(vq - zp) * s != v:
        return (f"pad value {attrs.value} is not exactly representable with s={float(s):.6g}, "
                f"zp={zp} in {p.dtype.name.lower()}")
    return float(vq)


def _int_twin(graph: Graph, op: Node, q: str, attrs: object) -> tuple[Node, list[TensorInfo]]:
    twin = graph.add_node(op.op, [q], len(op.outputs), attrs,
                          name=graph.unique_name(f"{op.name}_int"), origin=op.origin)
    return twin, infer_into(graph, twin)


def move_layout(graph: Graph, op: Node) -> str | bool:
    """Move the DQ feeding layout/pooling ``op`` after it; True, False (no pattern) or why."""
    found = dequantize_of(graph, op.inputs[0])
    if found is None:
        return False
    dq, p = found
    reason = _layout_check(graph, op, p)
    if reason:
        return reason
    attrs = op.attrs
    if op.op is Op.PAD and op.attrs.mode is PadMode.CONSTANT:
        value = _pad_value(op.attrs, p)
        if isinstance(value, str):
            return value
        attrs = PadAttrs(op.attrs.pads, op.attrs.mode, value)
    q = dq.inputs[0]
    if graph.info(q).quant != p.quant():
        return "the integer input's QuantParams differ from its dequantize's"
    # Dry run: the integer op's output infos tell whether a per-channel axis survives.
    twin, infos = _int_twin(graph, op, q, attrs)
    graph.remove_node(twin)
    if any(i.quant is None for i in infos):
        return f"the per-channel dequantize's axis {p.axis} does not survive {op.op.value}"
    outs = list(op.outputs)
    name, origin = op.name, list(op.origin)

    def build() -> None:
        new = graph.add_node(op.op, [q], [graph.unique_name(f"{o}_q") for o in outs], attrs,
                             name=name, infos=infos, origin=origin)
        for int_out, out, info in zip(new.outputs, outs, infos, strict=True):
            add_dequantize(graph, int_out, info.quant, out,  # type: ignore[arg-type]
                           origin=dq.origin, name=f"{dq.name}/after_{name}")

    rebuild(graph, [op], build)
    remove_if_unused(graph, dq)
    return True


def move_concat(graph: Graph, op: Node) -> str | bool:
    found = [dequantize_of(graph, v) for v in op.inputs]
    if not any(found):
        return False
    pairs = [f for f in found if f is not None]
    if len(pairs) == len(found):
        first = pairs[0][1]
        if first.per_tensor and all(p.same_as(first) for _, p in pairs):
            return _concat_same(graph, op, [dq for dq, _ in pairs], first)
    all_dequantized = len(pairs) == len(found)
    if all_dequantized and _shared_inputs(graph, op, pairs):
        return _concat_per_channel(graph, op, pairs) or _concat_requantize(graph, op)
    requantized = _concat_requantize(graph, op)
    if requantized is True or not all_dequantized:
        return requantized
    return _concat_per_channel(graph, op, pairs) or requantized


def _shared_inputs(graph: Graph, op: Node, pairs: list[tuple[Node, DqParams]]) -> bool:
    """Whether two or more inputs would each need a requantize kernel of their own in
    _concat_requantize: their integers are read elsewhere too (so no producer's store can
    write them in the Concat's scale) and their parameters are not the Concat's. DenseNet's
    dense blocks, where every layer's output enters every later Concat of the block: a kernel
    per input and Concat, where one per-channel requantize of the Concat's output does the
    same (a U-Net's skip connection, one such input, keeps the requantize)."""
    fq = readers(graph, op.outputs[0])
    target = quantize_only(graph, fq[0]) if len(fq) == 1 else None
    if target is None:
        return False
    shared = [p for dq, p in pairs
              if max(len(graph.consumers(dq.inputs[0])), len(graph.consumers(dq.outputs[0]))) > 1
              and not (p.per_tensor and p.dtype is target[0] and p.quant() == target[1])]
    return len(shared) >= 2


def _concat_per_channel(graph: Graph, op: Node, pairs: list[tuple[Node, DqParams]]) -> bool:
    """The integer Concat of the DQs' inputs and one DQ per channel along the concat axis
    (module docstring); False when a DQ is per channel along another axis or reads another
    type than u8 / s8, or a zero point has no re-encoding."""
    rank = graph.info(op.outputs[0]).rank
    axis = op.attrs.axis % rank
    if any(p.axis is not None and p.axis % rank != axis for _, p in pairs):
        return False
    ints = [dq.inputs[0] for dq, _ in pairs]
    if any(graph.info(q).quant != p.quant() for q, (_, p) in zip(ints, pairs, strict=True)):
        return False
    # one integer type: u8 when any input is u8, an s8 input re-encoded as q + 128 with its
    # zero point + 128 (the same values; a requantize its producer's store absorbs)
    dtype = DType.U8 if any(p.dtype is DType.U8 for _, p in pairs) else pairs[0][1].dtype
    encoded = [p if p.dtype is dtype else _shifted(p, dtype) for _, p in pairs]
    if any(e is None for e in encoded):
        return False
    scales, zero_points = [], []
    for v, p in zip(op.inputs, encoded, strict=True):
        assert p is not None
        channels = graph.info(v).shape[axis]
        scales.append(np.broadcast_to(p.scale.astype(F32), (channels,)))
        zero_points.append(np.broadcast_to(p.zero_point, (channels,)))
    quant = QuantParams.make(np.concatenate(scales), np.concatenate(zero_points), axis)
    out, name, origin, attrs = op.outputs[0], op.name, list(op.origin), op.attrs
    int_info = TensorInfo(graph.info(out).shape, dtype, quant)

    def build() -> None:
        for i, ((dq, p), e) in enumerate(zip(pairs, encoded, strict=True)):
            if e is not p:
                assert e is not None
                ints[i] = _reencoded(graph, dq, e)
        new = graph.add_node(Op.CONCAT, ints, [graph.unique_name(f"{out}_q")], attrs,
                             name=name, infos=[int_info], origin=origin)
        add_dequantize(graph, new.outputs[0], quant, out,
                       origin=[o for dq, _ in pairs for o in dq.origin],
                       name=f"{name}/dequantize")

    rebuild(graph, [op], build)
    for dq, _ in pairs:
        remove_if_unused(graph, dq)
    return True


def _shifted(p: DqParams, dtype: DType) -> DqParams | None:
    """``p`` re-encoded in the other 8-bit type, q ± 128 with zero point ± 128 (the same
    (q - zp)·s); None when a zero point would leave the new type's range."""
    zp = p.zero_point + (128 if dtype is DType.U8 else -128)
    lo, hi = dtype.range
    if p.dtype not in (DType.U8, DType.S8) or np.any(zp < lo) or np.any(zp > hi):
        return None
    return DqParams(p.scale, zp, p.axis, dtype)


def _reencoded(graph: Graph, dq: Node, e: DqParams) -> str:
    """The integers of ``dq``'s input in ``e``'s type: a quantize-only FakeQuantize of dq's
    output with the same scale and the shifted zero point — exact, round((q - zp)·s / s) is
    q - zp — shared by every Concat that reads dq."""
    x = dq.outputs[0]
    for reader in readers(graph, x):
        if reader.meta.get("reencodes") == (x, e.dtype.name):
            return reader.outputs[0]
    out = graph.unique_name(f"{dq.inputs[0]}_{e.dtype.name.lower()}")
    fq = add_onnx_quantize(graph, x, e, out, origin=dq.origin, name=f"{dq.name}/as_{e.dtype.name}")
    fq.meta["reencodes"] = (x, e.dtype.name)
    return fq.outputs[0]


def _concat_same(graph: Graph, op: Node, dqs: list[Node], p: DqParams) -> bool:
    ints = [dq.inputs[0] for dq in dqs]
    out, name, origin, attrs = op.outputs[0], op.name, list(op.origin), op.attrs

    def build() -> None:
        new = graph.add_node(Op.CONCAT, ints, [graph.unique_name(f"{out}_q")], attrs,
                             name=name, origin=origin)
        info = infer_into(graph, new)[0]
        add_dequantize(graph, new.outputs[0], info.quant or p.quant(), out,
                       origin=[o for dq in dqs for o in dq.origin], name=f"{name}/dequantize")

    rebuild(graph, [op], build)
    for dq in dqs:
        remove_if_unused(graph, dq)
    return True


def _concat_requantize(graph: Graph, op: Node) -> str | bool:
    out = op.outputs[0]
    fq = readers(graph, out)
    q = quantize_only(graph, fq[0]) if len(fq) == 1 and len(graph.consumers(out)) == 1 else None
    if q is None or out in graph.outputs:
        return ("Concat inputs are dequantized with different parameters and its output is not "
                "read by a single quantize-only FakeQuantize (no common integer type)")
    fq_node = fq[0]
    axis = op.attrs.axis
    rank = graph.info(out).rank
    r_axes = {range_axis(graph.info(r).shape, rank) for r in fq_node.inputs[1:5]}
    if axis in r_axes or "many" in r_axes:
        return "the FakeQuantize after the Concat is per channel along the concat axis"
    dtype, quant = q
    ranges = fq_ranges(graph, fq_node)
    if ranges is None:
        return "the FakeQuantize after the Concat has non-constant ranges"
    name, origin, final = op.name, list(op.origin), fq_node.outputs[0]
    sources = list(op.inputs)
    final_info = graph.info(final)
    levels = fq_node.attrs.levels

    def build() -> None:
        ints = []
        for i, v in enumerate(sources):
            info = graph.info(v)
            req = add_fake_quantize(graph, v, ranges, levels,
                                    TensorInfo(info.shape, dtype, quant),
                                    graph.unique_name(f"{v}_requantized"),
                                    origin=fq_node.origin, name=f"{fq_node.name}/input{i}",
                                    onnx=fq_node.attrs.onnx)
            ints.append(req.outputs[0])
        graph.add_node(Op.CONCAT, ints, [final], op.attrs, name=name, infos=[final_info],
                       origin=origin)

    rebuild(graph, [op, fq_node], build)
    return True


def move_pool(graph: Graph, op: Node) -> str | bool:
    found = dequantize_of(graph, op.inputs[0])
    if found is None:
        return False
    dq, p = found
    out = op.outputs[0]
    fqs = readers(graph, out)
    q = quantize_only(graph, fqs[0]) if len(fqs) == 1 and len(graph.consumers(out)) == 1 \
        else None
    if q is None or out in graph.outputs:
        return (f"{op.op.value} output is not read only by a quantize-only FakeQuantize "
                "(the int8 average needs an output scale)")
    if len(set(p.zero_point.tolist())) != 1:
        return "per-channel zero points (the int8 average takes one source zero point)"
    if p.axis not in (None, 1):
        return f"per-channel dequantize along axis {p.axis} (pooling channels are axis 1)"
    zx = int(p.zero_point[0])
    if op.op is Op.AVG_POOL:
        attrs: PoolAttrs = op.attrs
        if attrs.count_include_pad and zx and (any(attrs.pads) or attrs.ceil_mode):
            return (f"count_include_pad with source zero point {zx}: padded taps would be "
                    "the quantized 0, not the zero point")
    fq = fqs[0]
    rank = graph.info(out).rank
    r_axes = {range_axis(graph.info(r).shape, rank) for r in fq.inputs[1:5]} - {None}
    if r_axes - {1}:
        return "the FakeQuantize after the pool is per channel along an axis other than 1"
    channels = graph.info(out).shape[1]
    axis = 1 if r_axes else None
    il, ih, ol, oh = (tuple(float(v) for v in channel_vector(graph.constant(r), rank, axis,
                                                              channels))
                      for r in fq.inputs[1:5])
    dtype, out_quant = q
    known = out_quant.scale[0] if out_quant.per_tensor else None
    chain = [Scale.of(p.scale), Quantize(il, ih, ol, oh, fq.attrs.levels, dtype, scale=known,
                                         onnx=fq.attrs.onnx)]
    absorbed = list(dq.origin) + list(fq.origin)
    fused = Fused(chain=chain, src_zero_point=zx, absorbed=absorbed)
    final, info, name = fq.outputs[0], graph.info(fq.outputs[0]), op.name
    src, attrs, origin = dq.inputs[0], op.attrs, list(op.origin)

    def build() -> None:
        new = graph.add_node(op.op, [src], [final], attrs, name=name, infos=[info],
                             origin=origin)
        new.fused = fused

    rebuild(graph, [op, fq], build)
    remove_if_unused(graph, dq)
    return True


RULES: dict[Op, Callable[[Graph, Node], str | bool]] = {
    **{op: move_layout for op in LAYOUT},
    Op.CONCAT: move_concat,
    Op.AVG_POOL: move_pool,
    Op.GLOBAL_AVG_POOL: move_pool,
}


def run(graph: Graph, ctx: PassContext) -> int:
    changed = 0
    declined: dict[str, tuple[Node, str]] = {}
    progress = True
    while progress:
        progress = False
        for node in graph.topo_order():
            rule = RULES.get(node.op)
            if rule is None or node.fused is not None or not graph.has_node(node.name) \
                    or graph.node(node.name) is not node:
                continue
            ctx.visit(node)
            result = rule(graph, node)
            if result is True:
                changed += 1
                progress = True
                declined.pop(node.name, None)
            elif isinstance(result, str):
                declined[node.name] = (node, result)
    for name, (node, reason) in declined.items():
        if graph.has_node(name):
            ctx.decline(node, reason)
    if changed:
        graph.remove_unused()
    return changed
