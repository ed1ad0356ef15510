"""Float elementwise ops, normalizations, and data movement.

- Activations → eltwise (relu, leaky relu = relu with alpha, clip, logistic, tanh, hardswish
  (alpha 1/6, beta 1/2), hardsigmoid, gelu erf / tanh, sqrt; Pow with a constant exponent:
  square, sqrt or pow), in place when nothing reads the input later. Integer inputs run their reference semantics in numpy.
- Add / Sub / Mul / Div → binary: lower_binary.py.
- Expand → one reorder from a view of x with stride 0 along the broadcast dims.
- Pad (constant, reflect, edge) → reorders into the output: interior, then borders.
- BatchNormalization → binary mul with a binary add post-op (per channel a = γ/√(var+ε),
  b = β - mean·a). Softmax and LayerNormalization: lower_norm.py.
- Concat → concat (inputs in their own layouts, same data type); else numpy.
- Reshape / Flatten / Squeeze / Unsqueeze → a zero-copy view when the input is row-major, else
  a reorder to row-major first. Identity / Dropout → the input itself.
- Transpose → one reorder into the output's row-major buffer seen with permuted strides.
- Split / Slice → one reorder per output from a strided view of the (plain) input at a byte
  offset; the output keeps the input's dimension order.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from qfuse.compiler.lower.context import LowerContext
from qfuse.compiler.lower.fallback import lower_numpy, numpy_inputs
from qfuse.compiler.lower.layouts import (
    channels_last,
    const_memory,
    dense_in_order,
    dnnl_type,
    is_host,
    is_row_major,
    plain_md,
    same_bytes,
)
from qfuse.ir import Node, Op
from qfuse.ir.chain import Act
from qfuse.ir.postops import single_pixel_batch
from qfuse.ir.ops import (
    AlphaAttrs,
    AxisAttrs,
    BatchNormAttrs,
    ClipAttrs,
    DepthToSpaceAttrs,
    GeluApprox,
    GeluAttrs,
    HardSigmoidAttrs,
    HardSwishAttrs,
    PadAttrs,
    PadMode,
    PowAttrs,
    SliceAttrs,
    SplitAttrs,
    TransposeAttrs,
)
from qfuse.runtime.onednn import (
    Alg,
    Arg,
    DataType,
    DnnlError,
    MemoryDesc,
    PostOps,
    PrimitiveAttr,
    PrimitiveDesc,
    binary,
    concat,
    eltwise,
)
from qfuse.runtime.reference import IMPLS
from qfuse.runtime.reference.ops_shape import mirror_rows, onnx_slice

log = logging.getLogger(__name__)
F32 = np.float32
FLT_MAX = float(np.finfo(F32).max)
_ = Act  # chain activations use the same oneDNN algorithms (passes/composer.ACT_ALG)


def _activation(node: Node) -> tuple[Alg, float, float]:
    op = node.op
    if op is Op.RELU:
        return Alg.eltwise_relu, 0.0, 0.0
    if op is Op.LEAKY_RELU:
        attrs: AlphaAttrs = node.attrs
        return Alg.eltwise_relu, attrs.alpha, 0.0
    if op is Op.CLIP:
        clip: ClipAttrs = node.attrs
        return Alg.eltwise_clip, max(clip.min, -FLT_MAX), min(clip.max, FLT_MAX)
    if op is Op.SIGMOID:
        return Alg.eltwise_logistic, 0.0, 0.0
    if op is Op.TANH:
        return Alg.eltwise_tanh, 0.0, 0.0
    if op is Op.SWISH:
        return Alg.eltwise_swish, 1.0, 0.0
    if op is Op.HARD_SWISH:
        swish: HardSwishAttrs = node.attrs
        return Alg.eltwise_hardswish, swish.alpha, swish.beta
    if op is Op.HARD_SIGMOID:
        hs: HardSigmoidAttrs = node.attrs
        return Alg.eltwise_hardsigmoid, hs.alpha, hs.beta
    if op is Op.SQRT:
        return Alg.eltwise_sqrt, 0.0, 0.0
    if op is Op.EXP:
        return Alg.eltwise_exp, 0.0, 0.0
    if op is Op.POW:
        return _power(node.attrs)
    gelu: GeluAttrs = node.attrs
    alg = Alg.eltwise_gelu_tanh if gelu.approximate is GeluApprox.TANH else Alg.eltwise_gelu_erf
    return alg, 0.0, 0.0


def _power(attrs: PowAttrs) -> tuple[Alg, float, float]:
    """x^p: x·x for p = 2 (ONNX Runtime's kernel, bit for bit), the correctly rounded square
    root for p = 0.5, else eltwise pow ``alpha·x^beta`` with alpha = 1 (ulp-level)."""
    if attrs.exponent == 2.0:
        return Alg.eltwise_square, 0.0, 0.0
    if attrs.exponent == 0.5:
        return Alg.eltwise_sqrt, 0.0, 0.0
    return Alg.eltwise_pow, 1.0, attrs.exponent


def _float_inputs(ctx: LowerContext, node: Node) -> bool:
    return all(ctx.info(v).dtype.np == F32 for v in node.inputs if v) and all(
        ctx.info(v).dtype.np == F32 for v in node.outputs)


def _in_place_or_new(ctx: LowerContext, node: Node, src_slot: str, md: MemoryDesc) -> str:
    """The dst slot: the src's own buffer when nothing reads it later and the node reads no
    other value in that buffer (``x · xᵀ`` with the Transpose a view: writing over x would
    change elements xᵀ has not read yet; found by the fuzzer, seed 267204)."""
    y = node.outputs[0]
    if ctx.slots[src_slot].md == md and ctx.may_overwrite(src_slot, node):
        group = set(ctx.group(src_slot))
        if len({v for v in node.inputs if v and v in group}) <= 1:  # the source alone
            return ctx.define(y, md, alias=src_slot)
    return ctx.define(y, md)


def lower_eltwise(ctx: LowerContext, node: Node) -> None:
    if not _float_inputs(ctx, node):
        lower_numpy(ctx, node, note="integer activation")
        return
    alg, alpha, beta = _activation(node)
    x = node.inputs[0]
    home = ctx.md_of(x)

    def make(md: MemoryDesc) -> PrimitiveDesc:
        return eltwise(alg, md, md, alpha=alpha, beta=beta)

    pd = ctx.try_layouts("eltwise", make, [home, plain_md(home.dims, home.dtype)])
    src = ctx.source(x, pd.src_md)
    dst = _in_place_or_new(ctx, node, src, pd.src_md)  # type: ignore[arg-type]
    ctx.add_primitive(node.name, pd, {int(Arg.SRC): src, int(Arg.DST): dst},
                      info=ctx.info_for(node))


def lower_log(ctx: LowerContext, node: Node) -> None:
    """Log in numpy, the reference's own values: oneDNN 3.2's eltwise log is within 3.5e-6
    absolute only (29 float32 steps at log(0.26)), numpy's within 3 steps of onnxruntime's."""
    lower_numpy(ctx, node, note="numpy log: oneDNN's eltwise log is 29 float32 steps off at "
                                "log(0.26)")


def lower_batch_norm(ctx: LowerContext, node: Node) -> None:
    attrs: BatchNormAttrs = node.attrs
    x = node.inputs[0]
    shape = ctx.info(x).shape
    gamma, beta, mean, var = (ctx.need_const(node, i, n).astype(np.float64) for i, n in
                              ((1, "scale"), (2, "bias"), (3, "mean"), (4, "var")))
    a = gamma / np.sqrt(var + attrs.epsilon)
    b = beta - mean * a
    # oneDNN 3.2's jit binary applies a per-channel binary post-op wrongly when N > 1 and
    # every spatial dim is 1 (docs/onednn.md): such a batch runs over an (N, C) view
    flat = single_pixel_batch(shape)
    dims = (1, shape[1]) + (1,) * (0 if flat else len(shape) - 2)
    mul = const_memory(a.astype(F32).reshape(dims))
    add = const_memory(b.astype(F32).reshape(dims))
    post_ops = PostOps().append_binary(Alg.binary_add, add.md)
    attr = PrimitiveAttr().set_post_ops(post_ops)

    def make(md: MemoryDesc) -> PrimitiveDesc:
        return binary(Alg.binary_mul, md, mul.md, md, attr=attr)

    if flat:
        src = ctx.view(x, shape[:2], row_major=True)
        pd = make(ctx.slots[src].md)
        dst = ctx.temp(f"{node.outputs[0]}@view", ctx.slots[src].md,
                       alias=ctx.define(node.outputs[0], plain_md(shape, DataType.f32)))
    else:
        home = ctx.md_of(x)
        pd = ctx.try_layouts("binary", make, [home, plain_md(shape, DataType.f32)])
        src = ctx.source(x, pd.src_md)
        dst = _in_place_or_new(ctx, node, src, ctx.slots[src].md)
    ctx.add_primitive(node.name, pd, {int(Arg.SRC_0): src, int(Arg.DST): dst},
                      {int(Arg.SRC_1): mul, Arg.post_op(0, Arg.SRC_1): add},
                      info=ctx.info_for(node, post_ops=["binary_add"]))


def lower_concat(ctx: LowerContext, node: Node) -> None:
    attrs: AxisAttrs = node.attrs
    y = node.outputs[0]
    dtype = ctx.info(y).dtype
    if any(ctx.info(v).dtype != dtype for v in node.inputs):
        lower_numpy(ctx, node, note="inputs of different element types")
        return
    homes = [ctx.md_of(v) for v in node.inputs]
    mds = [homes, [channels_last(md.dims, md.dtype) for md in homes],
           [plain_md(md.dims, md.dtype) for md in homes]]
    pd = ctx.try_layouts("concat", lambda c: concat(c, attrs.axis), mds)
    args = {Arg.multiple_src(i): ctx.source(v, pd.arg_md(Arg.multiple_src(i)))
            for i, v in enumerate(node.inputs)}
    dst_md = pd.dst_md
    assert dst_md is not None
    args[int(Arg.DST)] = ctx.define(y, dst_md)
    ctx.add_primitive(node.name, pd, args, info=ctx.info_for(node))


def lower_alias(ctx: LowerContext, node: Node) -> None:
    """Identity / Dropout (first output only; a used Dropout mask goes to numpy)."""
    if any(ctx.graph.uses(v) for v in node.outputs[1:]):
        lower_numpy(ctx, node, note="Dropout mask is used")
        return
    ctx.home[node.outputs[0]] = ctx.home_slot(node.inputs[0])


def lower_reshape(ctx: LowerContext, node: Node) -> None:
    """Reshape / Flatten / Squeeze / Unsqueeze: a view of the row-major input."""
    y = node.outputs[0]
    ctx.home[y] = ctx.view(node.inputs[0], ctx.info(y).shape, base=y)


def lower_transpose(ctx: LowerContext, node: Node) -> None:
    attrs: TransposeAttrs = node.attrs
    x, y = node.inputs[0], node.outputs[0]
    yinfo = ctx.info(y)
    dtype = dnnl_type(yinfo.dtype)
    home = ctx.home_slot(x)
    md = ctx.slots[home].md
    wanted = ctx.preferred(y, dtype)
    if md.is_plain and ctx.slots[home].const is None and not ctx.is_output(y):
        # x's bytes may already be y's row-major layout (a channels-last NCHW tensor permuted
        # to NHWC, as ConvNeXt and tf2onnx models do), or the layout y's readers want (NHWC
        # bytes seen as NCHW, channels-last, for a convolution): y is then a view of x
        strides = tuple((md.strides or ())[p] for p in attrs.perm)
        row_major = plain_md(yinfo.shape, dtype)
        try:
            permuted = MemoryDesc.from_strides(yinfo.shape, dtype, strides)
        except DnnlError:
            permuted = None
        for target in (row_major, wanted):
            if (permuted is not None and target is not None and target.is_plain
                    and same_bytes(permuted, target)):
                ctx.home[y] = ctx.temp(f"{y}@perm", target, alias=home)
                return
    out = ctx.define(y, wanted if wanted is not None and wanted.is_plain
                     else plain_md(yinfo.shape, dtype))
    ys = ctx.slots[out].md.strides or ()
    strides = [0] * len(attrs.perm)
    for i, p in enumerate(attrs.perm):
        strides[p] = ys[i]
    view = ctx.temp(f"{y}@perm", MemoryDesc.from_strides(ctx.info(x).shape, dtype, strides),
                    alias=out)
    ctx.add_reorder(ctx.home_slot(x), view, role="op", node=node)


def lower_depth_to_space(ctx: LowerContext, node: Node) -> None:
    """DepthToSpace: one reorder between two 6-D strided views, [N, C', H, b, W, b] of x (its
    channel dim split per ``DepthToSpaceAttrs.channel_steps``) and of y (its rows and columns
    split into blocks). y is channels-last when x is (or its readers want a plain layout), so
    that a channels-last x is read in runs of C' channels (jit:uni)."""
    attrs: DepthToSpaceAttrs = node.attrs
    x, y = node.inputs[0], node.outputs[0]
    n, c_in, h, w = ctx.info(x).shape
    b = attrs.blocksize
    c = c_in // (b * b)
    source = _strided_source(ctx, x)
    md = ctx.slots[source].md
    sn, sc, sh, sw = md.strides or ()
    step_c, step_i, step_j = attrs.channel_steps(c)
    dims = (n, c, h, b, w, b)
    src = ctx.temp(f"{x}@blocks", MemoryDesc.from_strides(
        dims, md.dtype, (sn, step_c * sc, sh, step_i * sc, sw, step_j * sc)), alias=source)
    yshape = ctx.info(y).shape
    wanted = ctx.preferred(y, md.dtype)
    if wanted is None or not wanted.is_plain:
        wanted = channels_last(yshape, md.dtype) if sc < sw else plain_md(yshape, md.dtype)
    out = ctx.define(y, wanted)
    tn, tc, ty, tx = ctx.slots[out].md.strides or ()
    dst = ctx.temp(f"{y}@blocks", MemoryDesc.from_strides(
        dims, md.dtype, (tn, tc, b * ty, ty, b * tx, tx)), alias=out)
    ctx.add_reorder(src, dst, role="op", node=node)


def probe_depth_to_space(ctx: LowerContext, node: Node, port: int,
                         dtype: DataType) -> MemoryDesc | None:
    """Channels-last: each source pixel's b² blocks of C' channels are contiguous runs."""
    return channels_last(ctx.info(node.inputs[port]).shape, dtype)


def _strided_source(ctx: LowerContext, x: str) -> str:
    home = ctx.home_slot(x)
    md = ctx.slots[home].md
    if md.is_plain and ctx.slots[home].const is None:
        return home
    return ctx.plain_source(x)


def _views(ctx: LowerContext, node: Node, source: str,
           parts: list[tuple[tuple[int, ...], tuple[int, ...], int]]) -> None:
    """Per output a view (dims, element strides, element offset) of the source: the output
    itself when the view is one contiguous run, else one reorder from it; nothing for an
    output nothing reads (a Split part a Concat reads with its neighbours as one slice,
    passes/merge_split_concat.py)."""
    md = ctx.slots[source].md
    itemsize = md.numpy_dtype.itemsize
    try:
        views = [MemoryDesc.from_strides(dims, md.dtype, strides) for dims, strides, _ in parts]
    except DnnlError:  # e.g. a stepped slice whose strides interleave: not a oneDNN layout
        lower_numpy(ctx, node, note="the selection is not a oneDNN strided layout")
        return
    for value, view_md, (dims, _, offset) in zip(node.outputs, views, parts, strict=True):
        if not ctx.graph.uses(value):
            continue
        dense = dense_in_order(view_md, dims)
        if same_bytes(view_md, dense) and not ctx.is_output(value):
            # one contiguous run of the source (attention's q, k or v picked from the
            # stacked qkv, a leading-axis Split): the output is the view itself, no copy,
            # described densely (the source's strides of size-1 dims would reach readers
            # that compare them: oneDNN's jit binary, docs/onednn.md)
            ctx.home[value] = ctx.temp(f"{value}@view", dense, alias=source,
                                       offset=offset * itemsize)
            continue
        view = ctx.temp(f"{value}@view", view_md, alias=source, offset=offset * itemsize)
        wanted = ctx.preferred(value, md.dtype)
        out = ctx.define(value, wanted if wanted is not None and wanted.is_plain
                         else dense_in_order(md, dims))
        ctx.add_reorder(view, out, role="op", node=node)


PAD_TYPES = {DataType.f32: np.float32, DataType.u8: np.uint8, DataType.s8: np.int8}
# Most rows a reflect Pad copies one reorder each (lower_pad); more run in numpy: silero-vad's
# STFT reflects 32 samples on each side of a 512-sample chunk, 64 reorders of one sample,
# ~100 us, where numpy's copy (ops_shape.mirrored) takes a few.
MAX_REFLECT_ROWS = 16


def lower_pad(ctx: LowerContext, node: Node) -> None:
    """A Pad (no crop) as reorders into the output, laid out as its reader wants when that is
    a strided layout (channels-last for a convolution), else row-major: the input into its
    interior (a strided view), then per padded axis its begin and end borders. Constant mode:
    from constants of their shape (the corners are written twice, with the same value).
    Reflect and edge: from the output itself, axis after axis, each border slice copied from
    the slice it mirrors (reflect: one reorder per padded row; edge: one per side, from a
    view that strides 0 over the border) over the extent already filled (earlier axes with
    their borders, later ones their interior), so corners come out as ONNX's (numpy.pad's)
    mirror of the mirror. No numpy kernel: each is a jit reorder with no host round trip and
    no layout change around it (Swin-V2-T pads each window stage: its 10 constant Pads 1.66 →
    0.36 ms; TResNet-M's anti-aliasing reflect Pads ran in numpy between two reorders,
    ~0.35 ms each). Crops, reflect pads as long as the axis and reflections of more than
    MAX_REFLECT_ROWS rows run in numpy."""
    attrs: PadAttrs = node.attrs
    x, y = node.inputs[0], node.outputs[0]
    shape, out_shape = ctx.info(x).shape, ctx.info(y).shape
    rank = len(shape)
    dtype = dnnl_type(ctx.info(y).dtype)
    np_type = PAD_TYPES.get(dtype)
    begins, ends = attrs.pads[:rank], attrs.pads[rank:]
    if attrs.mode is PadMode.REFLECT and sum(attrs.pads) > MAX_REFLECT_ROWS:
        _numpy_reflection(ctx, node, list(zip(begins, ends)))
        return
    if np_type is None or any(p < 0 for p in attrs.pads) or 0 in shape or not (
            (attrs.mode is PadMode.CONSTANT and np_type(attrs.value) == attrs.value)
            or attrs.mode is PadMode.EDGE
            or (attrs.mode is PadMode.REFLECT
                and all(max(b, e) < n for b, e, n in zip(begins, ends, shape, strict=True)))):
        lower_numpy(ctx, node, note="oneDNN has no Pad primitive (a crop, a reflection as long "
                                    "as its axis or a value the type cannot hold run in numpy)")
        return
    wanted = ctx.preferred(y, dtype)
    md = wanted if (wanted is not None and wanted.strides and not wanted.inner_blocks
                    and tuple(wanted.dims) == tuple(out_shape)) else plain_md(out_shape, dtype)
    out = ctx.define(y, md)
    strides = ctx.slots[out].md.strides or ()
    itemsize = np.dtype(np_type).itemsize

    def view(name: str, dims: Sequence[int], start: Sequence[int],
             view_strides: Sequence[int] = strides) -> str:
        offset = sum(s * st for s, st in zip(start, strides, strict=True)) * itemsize
        return ctx.temp(f"{y}@{name}", MemoryDesc.from_strides(tuple(dims), dtype,
                                                               tuple(view_strides)),
                        alias=out, offset=offset)

    if attrs.mode is PadMode.CONSTANT:
        for axis in range(rank):
            for size, begin in ((begins[axis], 0), (ends[axis], out_shape[axis] - ends[axis])):
                if not size:
                    continue
                dims = list(out_shape)
                dims[axis] = size
                fill = ctx.const_slot(f"const:{y}@pad{axis}",
                                      const_memory(np.full(dims, attrs.value, np_type)))
                start = [0] * rank
                start[axis] = begin
                ctx.add_reorder(fill, view(f"pad{axis}", dims, start), role="op", node=node,
                                note=f"padding {attrs.value:g} on axis {axis}")
    ctx.add_reorder(ctx.home_slot(x), view("interior", shape, begins), role="op", node=node)
    if attrs.mode is PadMode.CONSTANT:
        return
    mode = attrs.mode.value
    for axis in range(rank):
        b, e, n = begins[axis], ends[axis], shape[axis]
        # the extent filled so far: earlier axes whole, later ones their interior
        dims = [out_shape[a] if a < axis else shape[a] for a in range(rank)]
        first = [0 if a < axis else begins[a] for a in range(rank)]
        # (first row written, rows, row read)
        rows = ([(0, b, b), (b + n, e, b + n - 1)] if attrs.mode is PadMode.EDGE
                else [(i, 1, 2 * b - i) for i in range(b)]
                + [(b + n + i, 1, b + n - 2 - i) for i in range(e)])
        for write, count, read in rows:
            if not count:
                continue
            dims[axis], first[axis] = count, read
            repeat = list(strides)
            repeat[axis] = 0  # edge: one row read count times
            src = view(f"{mode}{axis}_from", dims, first, repeat)
            first[axis] = write
            ctx.add_reorder(src, view(f"{mode}{axis}", dims, first), role="op", node=node,
                            note=f"{mode} padding on axis {axis}")


def _numpy_reflection(ctx: LowerContext, node: Node, widths: list[tuple[int, int]]) -> None:
    """A reflect Pad of more than MAX_REFLECT_ROWS rows as one numpy kernel: per padded
    axis one ``take`` of the source rows, their indices computed here, once (ops_shape
    mirror_rows); a crop or a reflection as long as its axis by the reference Pad."""
    x = node.inputs[0]
    shape = ctx.info(x).shape
    note = (f"a reflection of {sum(map(sum, widths))} rows: one reorder a row passes numpy's "
            f"copy from {MAX_REFLECT_ROWS}")
    if (is_host(ctx.info(x)) or any(min(w) < 0 for w in widths)
            or any(max(w) >= n for w, n in zip(widths, shape, strict=True))):
        lower_numpy(ctx, node, note=note)
        return
    takes = mirror_rows(shape, widths, reflect=True)

    def run(arrays: list[np.ndarray]) -> list[np.ndarray]:
        out = arrays[0]
        for axis, rows in takes:
            out = np.take(out, rows, axis=axis)
        return [out]

    ctx.add_numpy(node.name, run, [ctx.plain_source(x)], [ctx.define_plain(node.outputs[0])],
                  ctx.info_for(node, note=note))


def lower_where(ctx: LowerContext, node: Node) -> None:
    """Where(condition, x, y) as one numpy kernel writing its output in place: a copy of y,
    then of x where the condition holds (``numpy.copyto``: ONNX's broadcast; copies, so
    bit-exact). A constant condition (a causal attention mask) or branch (its −inf) is taken
    once at compile time. 3 µs for GPT-style scores [1, 4, 48, 48] against 6 µs for
    ``numpy.where`` and 14 µs as an onnxruntime island."""
    reads, inputs = numpy_inputs(ctx, node)

    def run(arrays: list[np.ndarray], outputs: list[np.ndarray]) -> None:
        cond, x, y = inputs(arrays)
        np.copyto(outputs[0], y)
        np.copyto(outputs[0], x, where=np.asarray(cond, bool))

    ctx.add_numpy(node.name, run, reads, [ctx.define_plain(node.outputs[0])],
                  ctx.info_for(node, note="oneDNN 3.2 has no select: numpy copies"), into=True)


def lower_gather(ctx: LowerContext, node: Node) -> None:
    """Gather as one numpy kernel calling the reference's ``take`` (runtime/reference/
    ops_elementwise.py: an index out of range an InputError naming the node) and writing its
    output in place, the int64 indices read as they are (table.NUMPY_LOWERINGS): 3 µs for 32
    token ids from a 1000 x 128 table, 10 µs as an onnxruntime island (4.2 µs through the
    generic numpy kernel, which copies the result again)."""
    reads, inputs = numpy_inputs(ctx, node)
    take = IMPLS[Op.GATHER]

    def run(arrays: list[np.ndarray], outputs: list[np.ndarray]) -> None:
        outputs[0][...] = take(node, inputs(arrays))[0]

    ctx.add_numpy(node.name, run, reads, [ctx.define_plain(node.outputs[0])],
                  ctx.info_for(node, note="oneDNN has no gather: numpy take"), into=True)


def lower_expand(ctx: LowerContext, node: Node) -> None:
    """Expand as one reorder from a view of x with stride 0 along each broadcast dim (oneDNN
    3.2's jit reorder reads such a view: measured, ``jit:uni``), into the layout its reader
    wants. The same values copied, no arithmetic. ECA-Net's channel attention expands its
    [1, C, 1, 1] gate to the image before quantizing it (timm's eca_resnet33ts: 10 numpy
    kernels). A host value (int64 shape arithmetic), or a view oneDNN's reorder declines,
    runs in numpy (table._numpy_instead, table._lower_or_numpy)."""
    x, y = node.inputs[0], node.outputs[0]
    out = tuple(ctx.info(y).shape)
    src = ctx.plain_source(x)
    md = ctx.slots[src].md
    lead = len(out) - len(md.dims)
    dims = (1,) * lead + tuple(md.dims)
    strides = (0,) * lead + tuple(md.strides or ())
    broadcast = tuple(0 if d == 1 and o != 1 else st
                      for d, o, st in zip(dims, out, strides, strict=True))
    view = ctx.temp(f"{x}@expand", MemoryDesc.from_strides(out, md.dtype, broadcast),
                    alias=src)
    dst = ctx.define(y, ctx.preferred(y, md.dtype) or plain_md(out, md.dtype))
    ctx.add_reorder(view, dst, role="op", node=node,
                    note="a reorder from a view with stride 0 along the broadcast dims")


def lower_split(ctx: LowerContext, node: Node) -> None:
    attrs: SplitAttrs = node.attrs
    source = _strided_source(ctx, node.inputs[0])
    md = ctx.slots[source].md
    strides, dims = md.strides or (), md.dims
    parts, start = [], 0
    for size in attrs.sizes:
        out = list(dims)
        out[attrs.axis] = size
        parts.append((tuple(out), tuple(strides), start * strides[attrs.axis]))
        start += size
    _views(ctx, node, source, parts)


def lower_slice(ctx: LowerContext, node: Node) -> None:
    attrs: SliceAttrs = node.attrs
    dims = ctx.info(node.inputs[0]).shape
    ranges = [slice(0, d, 1) for d in dims]
    for start, end, axis, step in zip(attrs.starts, attrs.ends, attrs.axes, attrs.steps,
                                      strict=True):
        axis = axis + len(dims) if axis < 0 else axis
        ranges[axis] = onnx_slice(dims[axis], start, end, step)
    if any((r.step or 1) < 0 for r in ranges) or ctx.info(node.outputs[0]).size == 0:
        lower_numpy(ctx, node, note="negative slice step or empty output")
        return
    source = _strided_source(ctx, node.inputs[0])
    strides = ctx.slots[source].md.strides or ()
    out_dims, out_strides, offset = [], [], 0
    for r, d, s in zip(ranges, dims, strides, strict=True):
        begin, stop, step = r.indices(d)
        out_dims.append(len(range(begin, stop, step)))
        out_strides.append(s * step)
        offset += begin * s
    _views(ctx, node, source, [(tuple(out_dims), tuple(out_strides), offset)])


def probe_concat(ctx: LowerContext, node: Node, port: int, dtype: DataType) -> MemoryDesc | None:
    """A Concat input should come in the layout of the inputs already computed (mixed layouts
    make the concat ``ref:any``): channels-last when one of them is."""
    if _computed_channels_last(ctx, node, port) is None:
        return None
    return channels_last(ctx.info(node.inputs[port]).shape, dtype)


def _computed_channels_last(ctx: LowerContext, node: Node, port: int, *,
                            same_shape: bool = False) -> MemoryDesc | None:
    """The layout of another input of ``node`` that is already computed in a plain layout
    other than row-major (channels-last), of ``port``'s shape if ``same_shape``; else None."""
    shape = ctx.info(node.inputs[port]).shape
    for i, value in enumerate(node.inputs):
        if i == port or value not in ctx.home or (same_shape and ctx.info(value).shape != shape):
            continue
        md = ctx.md_of(value)
        if md.is_plain and len(md.dims) in (3, 4, 5) and not is_row_major(md):
            return md
    return None


def probe_plain(ctx: LowerContext, node: Node, port: int, dtype: DataType) -> MemoryDesc | None:
    """numpy kernels read row-major arrays."""
    return plain_md(ctx.info(node.inputs[port]).shape, dtype)
