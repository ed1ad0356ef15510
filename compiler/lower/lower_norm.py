"""Softmax and LayerNormalization → oneDNN softmax / layer_normalization: float32, or with the
integer source and output passes/fuse_quantized_norm.py folded in (its docstring has the math
and the oneDNN 3.2 measurements this relies on).

- Plain node: float32 src and dst (an integer one runs its reference in numpy). Softmax runs
  along its axis; LayerNormalization over the last dim, dims axis..rank-1 flattened into one
  (zero copy), scale and bias as the primitive's SCALE / SHIFT.
- Fused node, integer output (``fused.chain == [Quantize]``): the dst is u8/s8 with the
  quantize's dst scale (mask 0, ``ir.chain.dst_quant``): ``saturate(rint(y/s))``.
  Softmax: zero point 0 (the pass guarantees it). LayerNormalization: a zero point zp is
  folded into the shift, ``β' = f32(β + zp·s_dst)``, since ``rint(y/s) + zp =
  rint((y + zp·s)/s)``.
- Fused LayerNormalization, integer source (``fused.src_scale`` = s): the primitive reads the
  u8/s8 values themselves, no src scale (oneDNN multiplies the *output* by a src scale) and no
  zero point, with ``ε' = f32(ε/s²)``: ``LN_ε(s·(q - zp)) = LN_{ε/s²}(q)``.
- Few wide rows (``_wide_row_parts``, torch's GroupNorm(1)): each row as up to 64 rows, their
  statistics computed by a training-mode primitive and pooled by numpy, then the layer
  normalization with those statistics (``use_global_stats``).
- *split*: as the graph was before the pass — a dequantize reorder into float32, the float
  primitive, a quantize reorder — in ``unfused`` mode (so `bench` shows what the folding
  saves) and when the int8 primitive only has a ``ref:`` implementation (softmax with an int8
  dst on AVX2 is ``ref:any``; layer normalization is ``jit:uni`` on every ISA).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import numpy as np

from qfuse.compiler.errors import UnsupportedModelError
from qfuse.compiler.lower.context import LowerContext
from qfuse.compiler.lower.fallback import lower_numpy
from qfuse.compiler.lower.lower_misc import _in_place_or_new
from qfuse.compiler.lower.layouts import (
    axis_innermost,
    const_memory,
    dnnl_type,
    gapless,
    is_row_major,
    is_slow,
    md_like,
    plain_md,
)
from qfuse.ir import DType, Node
from qfuse.ir.chain import Quantize, dst_quant
from qfuse.ir.ops import AxisAttrs, LayerNormAttrs, Op
from qfuse.runtime.onednn import (
    Alg,
    Arg,
    DataType,
    Memory,
    MemoryDesc,
    PrimitiveAttr,
    PrimitiveDesc,
    layer_normalization,
    softmax,
)
from qfuse.runtime.onednn.enums import PropKind

log = logging.getLogger(__name__)
F32 = np.float32
Quant = tuple[float, int]  # (scale, zero point) of one side


def _float_only(ctx: LowerContext, node: Node) -> bool:
    return all(ctx.info(v).dtype is DType.F32 for v in [*node.inputs, *node.outputs] if v)


def _dst_quant(node: Node) -> Quant | None:
    """(dst scale, dst zero point) of a fused node's integer output; None for float32."""
    if node.fused is None or not node.fused.chain:
        return None
    item = node.fused.chain[-1]
    found = dst_quant(item) if len(node.fused.chain) == 1 and isinstance(item, Quantize) \
        else f"the chain {node.fused.chain} is not one quantize"
    if isinstance(found, str):
        raise UnsupportedModelError(f"node {node}: {found} (fuse_quantized_norm.py)")
    return found


def _scales(dst: Quant | None) -> tuple[PrimitiveAttr, dict[int, Memory]]:
    attr, fixed = PrimitiveAttr(), {}
    if dst is not None:
        attr.set_scales_mask(Arg.DST, 0)
        fixed[Arg.scales(Arg.DST)] = Memory.scales(np.array([dst[0]], F32))
    return attr, fixed


def _requantize(ctx: LowerContext, node: Node, src: str, dst: str, side: int, q: Quant) -> None:
    """Split form: one reorder dequantizing (side SRC) or quantizing (side DST) with ``q``."""
    attr = PrimitiveAttr().set_scales_mask(side, 0)
    fixed = {Arg.scales(side): Memory.scales(np.array([q[0]], F32))}
    if q[1]:
        attr.set_zero_points_mask(side, 0)
        fixed[Arg.zero_points(side)] = Memory.zero_points(q[1])
    ctx.add_reorder(src, dst, attr=attr, fixed=fixed, role="op", node=node)


def _define(ctx: LowerContext, y: str, shape: tuple[int, ...], md: MemoryDesc,
            laid: MemoryDesc | None = None) -> str:
    """The output's slot as the primitive sees it: ``md`` of the (flattened) dims; when those
    are not the output's shape, a view of a slot of the output's shape, row-major or laid
    out as ``laid`` (a norm reading its source's bytes in their own order)."""
    if md.dims == shape and laid is None:
        return ctx.define(y, md)
    home = plain_md(shape, md.dtype) if laid is None else md_like(laid, md.dtype)
    assert home is not None
    out = ctx.define(y, home)
    return ctx.temp(f"{y}@flat", md, alias=out)


def _emit(ctx: LowerContext, node: Node, pd: PrimitiveDesc, src: str,
          fixed: dict[int, Memory], dst: Quant | None, details: list[str],
          stats: dict[int, str] | None = None, in_place: bool = False,
          laid: MemoryDesc | None = None) -> None:
    """Add the kernel writing the output (through a quantize reorder when split); ``stats``:
    its MEAN / VARIANCE slots when it takes them as inputs; ``in_place``: the primitive may
    write over its source (oneDNN's softmax reads each element before writing it), done when
    nothing reads the source later and the layouts match; ``laid``: the output's layout when
    the primitive writes its bytes in that order (``_sample_layout``)."""
    extra = dict(stats or {})
    y, shape = node.outputs[0], ctx.info(node.outputs[0]).shape
    dst_md = pd.dst_md
    assert dst_md is not None
    # LayerNormalization folds a dst zero point into its shift, rint((y + zp·s)/s): the level
    # form; softmax takes none.
    rounding = "" if dst is None else "round(x·(1/s)+zp)" if dst[1] else "round(x·(1/s))"
    info = ctx.info_for(node, optimizations=details, rounding=rounding)
    if dst is not None and dst_md.dtype == DataType.f32:  # split: quantize separately
        temp = ctx.temp(f"{y}@f32", dst_md)
        ctx.add_primitive(node.name, pd, {int(Arg.SRC): src, int(Arg.DST): temp, **extra},
                          fixed, info=info)
        out_md = md_like(dst_md, dnnl_type(ctx.info(y).dtype))
        assert out_md is not None
        _requantize(ctx, node, temp, _define(ctx, y, shape, out_md, laid), Arg.DST, dst)
        return
    if in_place and dst_md.dims == shape:
        out = _in_place_or_new(ctx, node, src, dst_md)
    else:
        out = _define(ctx, y, shape, dst_md, laid)
    ctx.add_primitive(node.name, pd, {int(Arg.SRC): src, int(Arg.DST): out, **extra}, fixed,
                      info=info)


def _pick(ctx: LowerContext, node: Node, kind: str,
          build: Callable[[bool], tuple[PrimitiveDesc, dict[int, Memory], list[str]]]
          ) -> tuple[PrimitiveDesc, dict[int, Memory], list[str]]:
    """``build(split)``: the folded int8 primitive unless the mode is unfused; split (the
    float primitive between reorders) when the folded one only has a ``ref:`` implementation
    (softmax with an int8 dst on AVX2)."""
    split = ctx.options.mode == "unfused" or node.fused is None
    pd, fixed, details = build(split)
    if not split and is_slow(pd.impl_name, kind):
        log.info("node %s: int8 %s runs on %s: split into reorders and a float %s", node,
                 kind, pd.impl_name, kind)
        pd, fixed, details = build(True)
    return pd, fixed, details


def lower_softmax(ctx: LowerContext, node: Node) -> None:
    fused = node.fused
    if fused is None and not _float_only(ctx, node):
        lower_numpy(ctx, node, note="integer softmax")
        return
    if fused is not None and fused.src_scale is not None:
        raise RuntimeError("a softmax cannot dequantize its source (fuse_quantized_norm.py)")
    attrs: AxisAttrs = node.attrs
    x = node.inputs[0]
    dst = _dst_quant(node)
    if dst is not None and dst[1]:
        raise RuntimeError(f"softmax dst zero point {dst[1]}: oneDNN takes none")
    home = ctx.md_of(x)
    alg = Alg.softmax_log if node.op is Op.LOG_SOFTMAX else Alg.softmax_accurate

    def build(split: bool) -> tuple[PrimitiveDesc, dict[int, Memory], list[str]]:
        attr, fixed = _scales(None if split else dst)
        dst_type = DataType.f32 if split else dnnl_type(ctx.info(node.outputs[0]).dtype)

        def make(md: MemoryDesc) -> PrimitiveDesc:
            out = md_like(md, dst_type) or plain_md(md.dims, dst_type)
            return softmax(md, out, axis=attrs.axis, attr=attr, alg=alg)

        # the jit softmax needs the axis innermost in memory: try that before the plain layout
        candidates = [home, axis_innermost(home, attrs.axis), plain_md(home.dims, home.dtype)]
        pd = ctx.try_layouts("softmax", make, candidates)
        return pd, fixed, ["int8_dst_scale"] if dst is not None and not split else []

    pd, fixed, details = _pick(ctx, node, "softmax", build)
    src_md = pd.src_md
    assert src_md is not None
    # in place: 2 MB less memory traffic for PP-OCRv4 rec's 40 x 6625 output (its marginal
    # cost in the model 60 → 50 us, 2-core AMD EPYC)
    _emit(ctx, node, pd, ctx.source(x, src_md), fixed, dst, details, in_place=True)


def probe_softmax(ctx: LowerContext, node: Node, port: int,
                  dtype: DataType) -> MemoryDesc | None:
    """A softmax wants its axis innermost in memory (its jit kernel needs it)."""
    attrs: AxisAttrs = node.attrs
    shape = ctx.info(node.inputs[port]).shape
    axis = attrs.axis + len(shape) if attrs.axis < 0 else attrs.axis
    if axis == len(shape) - 1:
        return None
    return axis_innermost(plain_md(shape, dtype), axis)


def lower_layer_norm(ctx: LowerContext, node: Node) -> None:
    attrs: LayerNormAttrs = node.attrs
    fused = node.fused
    x = node.inputs[0]
    shape = ctx.info(x).shape
    extra_used = any(ctx.graph.uses(v) for v in node.outputs[1:])
    if (fused is None and not _float_only(ctx, node)) or extra_used:
        lower_numpy(ctx, node, note="integer input or mean / inv-std outputs used")
        return
    src_q = None if fused is None or fused.src_scale is None else (
        fused.src_scale, fused.src_zero_point)
    dst = _dst_quant(node)
    axis = attrs.axis + len(shape) if attrs.axis < 0 else attrs.axis
    dims = (*shape[:axis], math.prod(shape[axis:])) if axis < len(shape) - 1 else shape
    if len(dims) == 1:
        dims = (1, *dims)
    channels = dims[-1]
    scale = np.broadcast_to(ctx.need_const(node, 1, "the scale").astype(F32).ravel(),
                            (channels,))
    bias = ctx.const(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
    # γ = 1 and β = 0 are left out (InstanceNormalization's LayerNorm, whose scale and bias
    # ran as a Mul / Add: a GroupNorm(1) row of 200704 would read 1.6 MB of ones and zeros;
    # y·1 and y + 0 are y, so the result is the same)
    if not np.any(scale != 1):
        scale = None
    if bias is not None and not np.any(bias):
        bias = None
    parts = _wide_row_parts(dims, scale, bias)
    if parts > 1:  # each row as `parts` rows, the statistics combined (WIDE_ROW)
        dims = (math.prod(dims[:-1]) * parts, channels // parts)
        channels = dims[-1]
        if bias is not None:
            bias = np.asarray(bias, F32).ravel()[:1]
    laid = _sample_layout(ctx, x, axis, scale, bias)
    if laid is not None:  # the sample's bytes in their own order, the output laid out alike
        view = f"{x}@sample{len(dims)}"
        if view not in ctx.home:
            ctx.home[view] = ctx.temp(view, plain_md(dims, laid.dtype),
                                      alias=ctx.home_slot(x))
    elif dims == shape:
        view = x
    else:
        view = f"{x}@ln{len(dims)}"
        if view not in ctx.home:
            ctx.home[view] = ctx.view(x, dims, row_major=True)
    home = ctx.md_of(view)

    def build(split: bool) -> tuple[PrimitiveDesc, dict[int, Memory], list[str]]:
        shift = None if bias is None else np.broadcast_to(bias.astype(F32).ravel(), (channels,))
        epsilon, details = float(attrs.epsilon), []
        if src_q is not None and not split:  # LN_ε(s·(q - zp)) = LN_{ε/s²}(q)
            epsilon = float(F32(attrs.epsilon / (src_q[0] * src_q[0])))
            details.append(f"int8_src(epsilon/s²={epsilon:.6g})")
        if dst is not None and not split:
            details.append("int8_dst_scale")
            if dst[1]:  # rint(y/s) + zp = rint((y + zp·s)/s)
                base = shift if shift is not None else np.zeros(channels, F32)
                shift = (base + F32(dst[1]) * F32(dst[0])).astype(F32)
                details.append("dst_zero_point_to_shift")
        src_type = DataType.f32 if split else home.dtype
        dst_type = DataType.f32 if split else dnnl_type(ctx.info(node.outputs[0]).dtype)
        attr, fixed = _scales(None if split else dst)

        def make(md: MemoryDesc) -> PrimitiveDesc:
            out = md_like(md, dst_type) or plain_md(md.dims, dst_type)
            return layer_normalization(md, out, epsilon=epsilon, use_scale=scale is not None,
                                       use_shift=shift is not None, attr=attr,
                                       use_global_stats=parts > 1)

        candidates = [md_like(home, src_type), plain_md(dims, src_type)]
        pd = ctx.try_layouts("layer_normalization", make,
                             [c for c in candidates if c is not None])
        if scale is not None:
            fixed[int(Arg.SCALE)] = const_memory(scale)
        if shift is not None:
            fixed[int(Arg.SHIFT)] = const_memory(shift)
        return pd, fixed, details

    pd, fixed, details = _pick(ctx, node, "layer_normalization", build)
    src_md = pd.src_md
    assert src_md is not None
    if src_md.dtype == home.dtype:
        src = ctx.source(view, src_md)
    else:  # split: dequantize into float32 first
        assert src_q is not None
        src = ctx.temp(f"{view}@f32", src_md)
        _requantize(ctx, node, ctx.source(view, md_like(src_md, home.dtype)), src, Arg.SRC,
                    src_q)
    if parts > 1:
        stats = _wide_row_statistics(ctx, node, src, src_md, parts)
        details.append(f"statistics_over_{parts}_parts_per_row")
    else:
        stats = {}
    if laid is not None:
        details.append("whole_sample_norm")
    _emit(ctx, node, pd, src, fixed, dst, details, stats, laid=laid)


def _sample_layout(ctx: LowerContext, x: str, axis: int, scale: np.ndarray | None,
                   bias: np.ndarray | None) -> MemoryDesc | None:
    """x's layout when the norm may read its bytes in their own order, else None: it
    normalizes each sample over all its values (axis 0 or 1; passes/whole_sample_norm.py)
    with no scale and one bias for all, which maps each value by the sample's two moments
    alone, wherever it lies; and x's layout is dense with the batch outermost (each sample's
    values are one run of bytes)."""
    md = ctx.md_of(x)
    shape = ctx.info(x).shape
    if (axis > 1 or len(shape) < 3 or scale is not None
            or (bias is not None and np.unique(bias).size > 1)):
        return None
    if not gapless(md) or is_row_major(md):
        return None  # blocked or with gaps; or row-major, where the plain view is this one
    if md.strides[0] * shape[0] != md.nelems:
        return None  # the batch is not the outermost dim
    return md


# A LayerNormalization with fewer rows than this and rows at least WIDE_ROW long is split
# (``_wide_row_parts``): oneDNN 3.2's layer normalization gives each row to one thread, and
# a single row streams its bytes three times on that thread. torch's GroupNorm(1) (PoolFormer)
# is one row of C·H·W: 200704 bytes in PoolFormer-S12's first stage, 0.7 ms in the running
# plan on a 2-core AVX-512 EPYC, where 64 rows of 3136 take 0.1 ms.
FEW_ROWS = 8
WIDE_ROW = 8192
MAX_PARTS = 64
MIN_PART = 1024


def _wide_row_parts(dims: tuple[int, ...], scale: np.ndarray | None,
                    bias: np.ndarray | None) -> int:
    """Into how many equal parts each row is split: the largest divisor of the row length up
    to MAX_PARTS leaving parts of at least MIN_PART; 1 (no split) for many or short rows, or
    with a scale or a bias that differs along the row (a part sees only its own slice)."""
    rows, length = math.prod(dims[:-1]), dims[-1]
    if rows >= FEW_ROWS or length < WIDE_ROW or scale is not None or (
            bias is not None and np.unique(bias).size > 1):
        return 1
    return max((p for p in range(2, MAX_PARTS + 1)
                if length % p == 0 and length // p >= MIN_PART), default=1)


def _wide_row_statistics(ctx: LowerContext, node: Node, src: str, src_md: MemoryDesc,
                         parts: int) -> dict[int, str]:
    """The MEAN / VARIANCE inputs of a layer normalization whose rows were split in
    ``parts``: oneDNN's training-mode layer normalization computes each part's mean m_i and
    (biased) variance v_i (its normalized output, written to a scratch slot, is not used);
    a numpy kernel combines them per original row in float64, the pooled statistics of
    equal-sized groups, ``μ = mean(m_i)``, ``σ² = mean(v_i + (m_i − μ)²)``, and repeats them
    for every part. The same two moments as one pass over the row, summed in another order:
    the normalized values can differ from the unsplit row's in the last bits of float32."""
    rows = src_md.dims[0]
    stat_md = plain_md((rows,), DataType.f32)
    pd = layer_normalization(src_md, md_like(src_md, src_md.dtype) or plain_md(
        src_md.dims, src_md.dtype), prop_kind=PropKind.forward_training)
    part_stats = {int(Arg.MEAN): ctx.temp(f"{node.name}@part_mean", stat_md),
                  int(Arg.VARIANCE): ctx.temp(f"{node.name}@part_variance", stat_md)}
    scratch = ctx.temp(f"{node.name}@part_scratch", pd.dst_md)
    info = ctx.info_for(node, note=f"statistics of {parts} parts of each row (training "
                                   "mode, its output unused)")
    ctx.add_primitive(f"{node.name}/statistics", pd,
                      {int(Arg.SRC): src, int(Arg.DST): scratch, **part_stats},
                      info=info, reads=[src], writes=[scratch, *part_stats.values()])
    stats = {int(Arg.MEAN): ctx.temp(f"{node.name}@mean", stat_md),
             int(Arg.VARIANCE): ctx.temp(f"{node.name}@variance", stat_md)}

    def pool(ins: list[np.ndarray], outs: list[np.ndarray]) -> None:
        # few numpy calls: this runs once per normalization (5 us, where np.mean and
        # np.repeat took 9)
        means = ins[0].astype(np.float64).reshape(-1, parts)
        variances = ins[1].astype(np.float64).reshape(-1, parts)
        mean = np.add.reduce(means, axis=1, keepdims=True) / parts
        deviations = means - mean
        variance = np.add.reduce(variances + deviations * deviations, axis=1,
                                 keepdims=True) / parts
        outs[0].reshape(-1, parts)[...] = mean
        outs[1].reshape(-1, parts)[...] = variance

    ctx.add_numpy(f"{node.name}/pool_statistics", pool,
                  [part_stats[int(Arg.MEAN)], part_stats[int(Arg.VARIANCE)]],
                  [stats[int(Arg.MEAN)], stats[int(Arg.VARIANCE)]],
                  ctx.info_for(node, note=f"pools the {parts} parts' statistics per row"),
                  into=True)
    return stats
