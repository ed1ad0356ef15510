"""A float FakeQuantize on an activation → quantize-only FakeQuantize + DequantizeLinear
(docs/design.md, pass 3, OpenVINO fake_quantize.md).

FakeQuantize (OpenVINO fake_quantize.md), for il < x <= ih, with L levels:

    k = round((x - il)/(ih - il)·(L-1))  in [0, L-1]
    y = k/(L-1)·(oh - ol) + ol = So·(k + T),   So = (oh - ol)/(L-1),  T = ol/So

``y`` is a dequantization ``So·(q - zp)`` of an integer ``q = k + T + zp`` exactly when T
is an integer (OpenVINO fake_quantize.md: "equation (c) is traditional dequantization only if Zo is
integer"); zp is then free as long as q's range [T + zp, T + zp + L - 1] fits the type.
Choice (per tensor, or per channel with one type for all channels):

1. the type and zero point the FakeQuantize was made from (``meta["qdq"]``, written by
   qdq_to_fake_quantize) when they reproduce its ranges bit for bit: u8 stays u8, s8 stays s8;
2. s8 with zp 0 (symmetric; OpenVINO fake_quantize.md: "I8 is better choice for symmetric quantization");
3. u8 with zp 0 (ranges starting at 0: ReLU outputs);
4. u8 with zp = -T (q starts at 0), 5. s8 with zp = -128 - T (q starts at -128).

The quantize-only FakeQuantize keeps il, ih, L and gets ol' = T + zp, oh' = ol' + L - 1: its
formula computes k/(L-1)·(L-1) + ol', the integer q when k/(L-1)·(L-1) is exact in float32
(true for L = 256, 255 and powers of two; not for some L, e.g. 14 — checked, declined). The
level k is computed by the same float32 expression before and after, so it is bit-identical;
the dequantized value So·(q - zp) differs from k/(L-1)·(oh - ol) + ol by float32 rounding
only (a few ulps), and for pairs from Q/DQ it *is* ONNX's DequantizeLinear.

Unsigned activations (``PassContext.unsigned_activations``, set where oneDNN's int8 kernels
have no VNNI / AMX): an s8 choice becomes u8 with every zero point and q bound + 128. Exact:
``q' = q + 128`` for every input (ONNX's ``saturate(rint(x/s) + zp)`` saturates to [0, 255]
where it saturated to [-128, 127]; the FakeQuantize form adds 128 to its integer output
range), and ``(q' − (zp + 128))·s = (q − zp)·s``. Without VNNI those kernels read only a u8
source exactly (compiler/lower/no_vnni.py), so an s8 tensor (NNCF's symmetric activations) was
shifted by its own reorder before its convolutions read it: one kernel per tensor (NNCF
YOLOv8n: 88). Kept s8 (``_may_shift``): a tensor read as a matmul's or convolution's second
operand (oneDNN takes s8 weights), and one written or read by an op whose int8 form folds the
zero point into float sums or roundings of its own (LayerNorm, Softmax, average pooling,
reductions: ``rint(x/s + zp)``, ``avg(q) − zp``), where the shift could move a tie.

Zero level (on every CPU): an activation whose levels start at its zero point is written as u8
with zero point 0, the encoding oneDNN's fastest int8 kernels read (a convolution's or
matmul's source zero point costs a compensation pass, and the depthwise ``brdgmm`` kernels
take none: a source with one runs on ``jit_int8``, 1.4–2x their time). Two cases, both
exact, both only where ``_may_shift`` allows (no writer or reader folds the zero point into
a float rounding of its own):

- s8 with zero point -128 (onnxruntime's default s8 asymmetric activations after a ReLU):
  the unsigned form above, ``q' = q + 128`` with zero point 0, for every input;
- an ONNX pair of u8 or s8 type T with zero point z quantizing an x known to be >= 0 with
  an upper bound hi (``upper_bound``: a ReLU's or ``Clip(lo >= 0)``'s output, a u8 tensor
  with zero point 0 dequantized, through max pooling and views; PyTorch's FX quantization
  keeps a ReLU6's input parameters, e.g. u8 with z = 63, for its Hardtanh output; s8
  symmetric activations after a ReLU, and the pair of the same parameters after its max
  pooling): ``rint(x/s) >= 0``, so ONNX's ``q = saturate_T(rint(x/s) + z)`` gives
  ``q - z = min(rint(x/s), max_T - z)``, which is ``saturate_u8(rint(min(x, c)/s))`` with
  ``c = (max_T - z)·s`` in float32 (division and rint are monotone, and ``c/s`` is within
  2 ulp of ``max_T - z``, so ``rint(c/s) = max_T - z``): the pair with u8 and zero point 0
  after a Clip to c, and ``(q' - 0)·s = (q - z)·s``. The Clip is left out where x's own
  bound already keeps ``rint(hi/s) <= max_T - z`` (a ReLU6 at FX's parameters, the pair
  after a max pooling of the same parameters as the one before it); else it joins the
  producer's post-ops.

Declined (reason recorded): ranges not constant, L > 256 or < 2, ranges varying along more
than one axis, il >= ih, oh <= ol, an output step So above quant_utils.MAX_SCALE (the int8
kernels multiply scales in float32, which would overflow: the FakeQuantize stays a float32
kernel), a non-integral T (no integer zero point), a range that
fits neither u8 nor s8, a level count whose integers are not exact in float32. FakeQuantize
on constants (weights) is left to fold_weight_quantize.
"""

from __future__ import annotations

import logging

import numpy as np

from qfuse.ir.graph import Graph, Node
from qfuse.ir.ops import ClipAttrs, Op
from qfuse.ir.types import DType, OnnxQuantize, QuantParams, TensorInfo
from qfuse.passes.base import PassContext
from qfuse.passes.qdq_to_fake_quantize import qdq_ranges
from qfuse.passes.quant_utils import (
    MAX_SCALE,
    DqParams,
    add_dequantize,
    add_fake_quantize,
    along,
    fq_ranges,
    is_constant_operand,
    range_axis,
    rebuild,
)

log = logging.getLogger(__name__)

F32 = np.float32
INTEGRAL_TOLERANCE = 1e-3  # |T - round(T)|; float32 ranges of a real Q/DQ give ~1e-5


def channel_vector(a: np.ndarray, rank: int, axis: int | None, channels: int) -> np.ndarray:
    """Range ``a`` as one value per channel of ``axis`` (one value when per tensor)."""
    padded = np.asarray(a, dtype=F32).reshape((1,) * (rank - a.ndim) + a.shape)
    if axis is None:
        return padded.reshape(1)
    shape = [1] * rank
    shape[axis] = channels
    return np.broadcast_to(padded, shape).reshape(channels).copy()


class Decomposition:
    """The integer form of one FakeQuantize: type, scale, zero point and q's bounds."""

    def __init__(self, dtype: DType, scale: np.ndarray, zero_point: np.ndarray,
                 q_low: np.ndarray, levels: int, axis: int | None,
                 onnx: OnnxQuantize | None = None) -> None:
        self.dtype, self.scale, self.zero_point = dtype, scale, zero_point
        self.q_low, self.levels, self.axis = q_low, levels, axis
        self.onnx = onnx  # the Q/DQ pair the FakeQuantize stands for, as its levels
        # (il, ih) of the quantize-only FakeQuantize when not the original node's
        self.input_range: tuple[np.ndarray, np.ndarray] | None = None
        # the zero level's bound on x where the type's saturation would otherwise bind
        self.clamp: np.float32 | None = None

    def quant(self) -> QuantParams:
        if self.axis is None:
            return QuantParams.make(self.scale[0], self.zero_point[0])
        return QuantParams.make(self.scale, self.zero_point, self.axis)


def _from_meta(node: Node, ranges: tuple[np.ndarray, ...], rank: int,
               levels: int) -> Decomposition | None:
    recorded = node.meta.get("qdq")
    if recorded is None or levels != 256:
        return None
    dtype, quant = recorded
    scale, zp = quant.scale_array(), quant.zero_point_array().astype(np.int64)
    low, high = qdq_ranges(DqParams(scale, zp, quant.axis, dtype), rank)
    il, ih, ol, oh = ranges
    same = all(np.array_equal(np.broadcast_to(a, np.broadcast(a, b).shape),
                              np.broadcast_to(b, np.broadcast(a, b).shape))
               for a, b in ((il, low), (ol, low), (ih, high), (oh, high)))
    if not same:
        return None
    q_low = np.full(scale.shape, dtype.range[0], dtype=np.int64)
    onnx = node.attrs.onnx
    if onnx is not None:
        onnx = OnnxQuantize(onnx.dtype, onnx.quant, dequantize=False)
    return Decomposition(dtype, scale, zp, q_low, levels, quant.axis, onnx)


def _choose(t: np.ndarray, levels: int) -> tuple[DType, np.ndarray] | None:
    """(type, zero points) for the integer offsets ``t`` (module docstring, choices 2-5)."""
    span = levels - 1
    candidates = [
        (DType.S8, np.zeros_like(t)),
        (DType.U8, np.zeros_like(t)),
        (DType.U8, -t),
        (DType.S8, -128 - t),
    ]
    for dtype, zp in candidates:
        lo, hi = dtype.range
        q_low = t + zp
        if (zp.min() >= lo and zp.max() <= hi and q_low.min() >= lo
                and q_low.max() + span <= hi):
            return dtype, zp
    return None


def plan(graph: Graph, node: Node) -> Decomposition | str:
    """The decomposition of FakeQuantize ``node``, or why there is none."""
    ranges = fq_ranges(graph, node)
    if ranges is None:
        return "input/output ranges are not constants"
    levels = node.attrs.levels
    if not 2 <= levels <= 256:
        return f"levels={levels} does not fit 8 bits (want 2..256)"
    x = graph.info(node.inputs[0])
    rank = x.rank
    axes = {range_axis(a.shape, rank) for a in ranges} - {None}
    if len(axes) > 1 or "many" in axes:
        return "ranges vary along more than one axis (not per tensor or per channel)"
    axis = axes.pop() if axes else None
    channels = x.shape[axis] if isinstance(axis, int) else 1
    il, ih, ol, oh = (channel_vector(a, rank, axis, channels) for a in ranges)  # type: ignore
    if np.any(il >= ih):
        return "input_low >= input_high"
    if np.any(oh <= ol):
        return "output_high <= output_low (constant or decreasing output)"
    step = (oh.astype(np.float64) - ol) / (levels - 1)
    if not np.all(step <= MAX_SCALE):  # inf too: s·(qmin − zp) past float32's largest
        return (f"output step {float(np.max(step)):.3g} is above {MAX_SCALE:.3g}, where the "
                f"int8 kernels' products of scales overflow float32: the FakeQuantize runs in "
                f"float32")
    found = _from_meta(node, ranges, rank, levels)
    if found is not None:
        return found
    t = ol / step
    t_int = np.rint(t)
    worst = float(np.max(np.abs(t - t_int)))
    if worst > INTEGRAL_TOLERANCE:
        return (f"output range is not a dequantization with an integer zero point: "
                f"output_low/step = {float(t.ravel()[np.argmax(np.abs(t - t_int))]):.6g}")
    chosen = _choose(t_int.astype(np.int64), levels)
    if chosen is None:
        return f"q range [{int(t_int.min())}, {int(t_int.max()) + levels - 1}] + a zero point " \
               "fits neither u8 nor s8"
    dtype, zp = chosen
    return Decomposition(dtype, step.astype(F32), zp, t_int.astype(np.int64) + zp, levels,
                         axis if channels > 1 else None)  # type: ignore[arg-type]


def unsigned(d: Decomposition) -> Decomposition:
    """``d`` as u8 with zero points and q bounds + 128 (module docstring)."""
    onnx = d.onnx
    if onnx is not None:
        quant = onnx.quant
        shifted = QuantParams(quant.scale, tuple(z + 128 for z in quant.zero_point), quant.axis)
        onnx = OnnxQuantize(DType.U8, shifted, dequantize=onnx.dequantize)
    return Decomposition(DType.U8, d.scale, d.zero_point + 128, d.q_low + 128, d.levels,
                         d.axis, onnx)


def zero_level(graph: Graph, fq: Node, d: Decomposition) -> Decomposition | None:
    """``d`` as u8 with zero point 0 where that is exact (module docstring, "Zero level"),
    else None."""
    if d.dtype is DType.S8 and np.all(d.zero_point == -128):
        return unsigned(d)
    if d.onnx is None or d.axis is not None:
        return None
    scale, zp = d.onnx.quant.scale_array().astype(F32), int(d.zero_point[0])
    if d.dtype is DType.U8 and zp == 0:
        return None
    bound = upper_bound(graph, fq.inputs[0])
    if bound is None:
        return None
    limit = d.dtype.range[1] - zp  # the largest q - zp
    clamp = None
    with np.errstate(over="ignore"):
        top = np.rint(F32(bound) / scale[0])
        if not top <= limit:  # c/s lies within 2 ulp of the integer limit: rint gives it
            clamp = F32(F32(limit) * scale[0])
    zero = np.zeros(1, np.int64)
    onnx = OnnxQuantize(DType.U8, QuantParams.make(scale[0], 0), dequantize=False)
    found = Decomposition(DType.U8, d.scale, zero, zero, d.levels, None, onnx)
    low, high = qdq_ranges(DqParams(scale, zero, None, DType.U8), graph.info(fq.inputs[0]).rank)
    found.input_range = (low, high)
    found.clamp = clamp
    return found


def upper_bound(graph: Graph, value: str, depth: int = 0) -> float | None:
    """An upper bound of the float32 tensor ``value`` where it is known to be >= 0, else None:
    a ReLU's output (inf), a Clip's with ``lo >= 0`` (hi), the dequantized values of a u8
    tensor with zero point 0 (``255·s``, or ``rint(b/s)·s`` below a quantize of values up to
    b: division, rint and the product are monotone), carried through ops that only select or
    move values (max pooling, views, slices)."""
    node = graph.producer(value)
    if node is None or depth > 64:
        return None
    if node.op is Op.RELU:
        return float("inf")
    if node.op is Op.CLIP:
        return node.attrs.max if node.attrs.min >= 0 else None
    if node.op in _SELECTING:
        return upper_bound(graph, node.inputs[0], depth + 1)
    if node.op is not Op.DEQUANTIZE_LINEAR:
        return None
    quant = graph.info(node.inputs[0]).quant
    if (graph.info(node.inputs[0]).dtype is not DType.U8 or quant is None
            or quant.axis is not None or quant.zero_point != (0,)):
        return None
    scale, top = F32(quant.scale[0]), F32(255)
    quantize = graph.producer(node.inputs[0])
    if quantize is not None and quantize.op is Op.FAKE_QUANTIZE:
        below = upper_bound(graph, quantize.inputs[0], depth + 1)
        if below is not None:
            with np.errstate(over="ignore", invalid="ignore"):
                top = min(top, np.rint(F32(below) / scale))
    return float(F32(top * scale))


_VIEWS = frozenset({Op.RESHAPE, Op.FLATTEN, Op.TRANSPOSE, Op.SQUEEZE, Op.UNSQUEEZE,
                    Op.IDENTITY})
_SELECTING = frozenset({Op.MAX_POOL, Op.GLOBAL_MAX_POOL, Op.SLICE, Op.SPLIT, *_VIEWS})
# ops whose int8 forms compute with (q - zp) exactly, whatever zp is: the shift cannot move
# a rounding (a LayerNorm's or Softmax's int8 source and store, a pooling average, fold the
# zero point into float sums or roundings of their own, so their tensors stay s8)
_SHIFT_SAFE = frozenset({
    Op.CONV, Op.CONV_TRANSPOSE, Op.MATMUL, Op.GEMM, Op.ADD, Op.SUB, Op.MUL, Op.RELU, Op.CLIP,
    Op.LEAKY_RELU, Op.PRELU, Op.SIGMOID, Op.SWISH, Op.TANH, Op.HARD_SIGMOID, Op.HARD_SWISH,
    Op.GELU, Op.MAX_POOL, Op.GLOBAL_MAX_POOL, Op.CONCAT, Op.SPLIT, Op.SLICE, Op.PAD,
    Op.RESIZE, Op.FAKE_QUANTIZE, *_VIEWS})
_COMPUTE = frozenset({Op.CONV, Op.CONV_TRANSPOSE, Op.MATMUL, Op.GEMM})


def _may_shift(graph: Graph, fq: Node) -> bool:
    """Can the tensor ``fq`` quantizes become u8 without moving a rounding? What computes it
    (``_writer``) and every reader (through reshapes and transposes) are ops whose int8 forms
    use (q - zp) exactly, and none reads it as a compute op's second operand (oneDNN takes s8
    weights)."""
    writer = _writer(graph, fq.inputs[0])
    if writer is not None and writer.op is Op.DEQUANTIZE_LINEAR:
        # the FakeQuantize requantizes integers (through views): u8 where they are u8 (this
        # pass made them so first, in topological order), so that a pair of the same
        # parameters stays one eliminate_requantize drops
        writer_safe = graph.info(writer.inputs[0]).dtype is DType.U8
    else:
        writer_safe = writer is None or writer.op in _SHIFT_SAFE
    return writer_safe and _readers_shift_safe(graph, fq.outputs[0])


def _writer(graph: Graph, value: str) -> Node | None:
    """The op that computes ``value`` up a chain of elementwise ops with constant operands
    (a decomposed BatchNorm's Mul and Add after a convolution, a LayerNorm's ``x·γ + β`` after
    its division) and of views (a pooling's Flatten), None for a graph input."""
    node = graph.producer(value)
    while node is not None and node.op in (Op.ADD, Op.SUB, Op.MUL, Op.DIV, *_VIEWS):
        runtime = [v for v in node.inputs if v and graph.constant(v) is None]
        if len(runtime) != 1:
            return node
        node = graph.producer(runtime[0])
    return node


def _readers_shift_safe(graph: Graph, value: str) -> bool:
    for reader, port in graph.consumers(value):
        if reader.op not in _SHIFT_SAFE or (reader.op in _COMPUTE and port > 0):
            return False
        if reader.op in _VIEWS and not all(_readers_shift_safe(graph, out)
                                            for out in reader.outputs):
            return False
    return True


def integers_exact(q_low: np.ndarray, levels: int) -> bool:
    """Does the quantize-only formula k/(L-1)·(L-1) + ol' give exactly k + ol' in float32?"""
    k = np.arange(levels, dtype=F32)
    steps = F32(levels - 1)
    for low in np.unique(q_low):
        if not np.array_equal(k / steps * steps + F32(low), k + F32(low)):
            return False
    return True


def _rewrite(graph: Graph, fq: Node, d: Decomposition) -> str:
    """``fq`` as a quantize-only FakeQuantize and a dequantize; returns the integer value."""
    x = fq.inputs[0]
    info = graph.info(x)
    il, ih = d.input_range or tuple(graph.constant(n) for n in fq.inputs[1:3])
    ol = along(d.q_low.astype(F32), info.rank, d.axis)
    oh = along((d.q_low + d.levels - 1).astype(F32), info.rank, d.axis)
    out = fq.outputs[0]
    q_info = TensorInfo(info.shape, d.dtype, d.quant())
    q_origin = fq.meta.get("q_origin", fq.origin)
    dq_origin = fq.meta.get("dq_origin", fq.origin)

    # Names as in the Q/DQ model the FakeQuantize came from, when there was one.
    int_name = fq.meta.get("q_output", f"{out}_q")
    q_name = q_origin[0] if "q_origin" in fq.meta else f"{fq.name}/quantize"
    dq_name = dq_origin[0] if "dq_origin" in fq.meta else f"{fq.name}/dequantize"

    def build() -> None:
        src = x
        if d.clamp is not None:
            src = graph.add_node(Op.CLIP, [x], 1, ClipAttrs(0.0, float(d.clamp)),
                                 name=graph.unique_name(f"{fq.name}/saturation"),
                                 infos=[info], origin=list(fq.origin)).outputs[0]
        q = add_fake_quantize(graph, src, (il, ih, ol, oh), d.levels, q_info,  # type: ignore
                              graph.unique_name(int_name), origin=q_origin, name=q_name,
                              onnx=d.onnx)
        q.meta["decomposed_from"] = fq.name
        add_dequantize(graph, q.outputs[0], d.quant(), out, origin=dq_origin, name=dq_name)

    rebuild(graph, [fq], build)
    return graph.producer(out).inputs[0]  # the dequantize writing ``out`` reads the integers


def run(graph: Graph, ctx: PassContext) -> int:
    changed = 0
    for fq in graph.topo_order():
        if fq.op is not Op.FAKE_QUANTIZE:
            continue
        ctx.visit(fq)
        if graph.info(fq.outputs[0]).dtype.is_integer or is_constant_operand(graph, fq.inputs[0]):
            continue  # already quantize-only / weights (fold_weight_quantize)
        found = plan(graph, fq)
        if isinstance(found, str):
            ctx.decline(fq, found)
            continue
        if not integers_exact(found.q_low, found.levels):
            ctx.decline(fq, f"levels={found.levels}: k/(L-1)·(L-1) is not exact in float32, "
                            "a quantize-only FakeQuantize would not give integers")
            continue
        given = found
        zero = zero_level(graph, fq, found)
        if zero is not None and _may_shift(graph, fq):
            found = zero
        elif ctx.unsigned_activations and found.dtype is DType.S8 \
                and _may_shift(graph, fq):
            found = unsigned(found)
        q = _rewrite(graph, fq, found)
        if found is not given and given.onnx is not None:  # the model's integers, re-encoded
            graph.level_offsets[q] = (int(found.zero_point[0] - given.zero_point[0]),
                                      given.dtype)
        changed += 1
    if changed:
        graph.remove_unused()
    return changed
