"""Primitive-descriptor constructors: one function per oneDNN primitive qfuse uses.

Each returns a `PrimitiveDesc` (query `.impl_name`, `.md(...)`, `.arg_md(...)`, then
`.create()`). Conventions, as in the C API:

- Shapes: activations {N, C, [D,] [H,] W}; conv weights {O, I, kh, kw} or grouped
  {G, O/G, I/G, kh, kw} (depthwise: G = C, O/G = I/G = 1); deconv weights {[G,] O, I, kh, kw}.
- `dilation` is in oneDNN's convention: 0 = dense kernel (ONNX dilation d becomes d - 1).
- `padding_l`/`padding_r` may differ (asymmetric padding); all spatial lists default to 1
  (strides) or 0 (padding, dilation).
- A descriptor made with FormatTag.any lets the primitive choose a layout; query the chosen
  one from the PrimitiveDesc and fill it with a reorder (never a memcpy: int8 weights in
  blocked layouts carry compensation data).
- `attr=None` means `PrimitiveAttr()`: no scales, no post-ops, scratchpad mode user.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from ctypes import byref, c_float, c_void_p

import numpy as np

from qfuse.runtime.onednn import _lib
from qfuse.runtime.onednn._lib import C, check
from qfuse.runtime.onednn.attr import PrimitiveAttr
from qfuse.runtime.onednn.enums import (
    ELTWISE_ALGS,
    LRN_ALGS,
    POOLING_ALGS,
    REDUCTION_ALGS,
    RESAMPLING_ALGS,
    RNN_CELL_ALGS,
    SOFTMAX_ALGS,
    Alg,
    Arg,
    NormFlags,
    PrimitiveKind,
    PropKind,
    RnnDirection,
)
from qfuse.runtime.onednn.memory import Engine, Memory, MemoryDesc, data_type_of, default_engine
from qfuse.runtime.onednn.primitive import PrimitiveDesc

log = logging.getLogger(__name__)

Ints = Sequence[int]
INFERENCE = PropKind.forward_inference


def _spatial(name: str, values: Ints | None, count: int, default: int) -> tuple[int, ...]:
    if values is None:
        return (default,) * count
    values = tuple(int(v) for v in values)
    if len(values) != count:
        raise ValueError(f"{name} needs {count} spatial values, got {values}")
    return values


def _h(md: MemoryDesc | None) -> c_void_p | None:
    return md.handle if md is not None else None


def _desc(**mds: MemoryDesc | None) -> str:
    return " ".join(f"{k}={v.describe() if v is not None else None}" for k, v in mds.items())


def _finish(kind: PrimitiveKind, call: str, status: int, handle: c_void_p, attr: PrimitiveAttr,
            engine: Engine, detail: str) -> PrimitiveDesc:
    check(status, call, f"{detail} attr=[{attr.info().describe()}]")
    pd = PrimitiveDesc(handle, kind, attr.info(), engine, detail)
    log.debug("created %s: %s", pd.name, detail)
    return pd


def _conv_like(kind: PrimitiveKind, src: MemoryDesc, weights: MemoryDesc, dst: MemoryDesc,
               bias: MemoryDesc | None, strides: Ints | None, padding_l: Ints | None,
               padding_r: Ints | None, dilation: Ints | None, attr: PrimitiveAttr | None,
               engine: Engine | None, prop_kind: PropKind) -> PrimitiveDesc:
    spatial = src.ndims - 2
    if spatial < 1:
        raise ValueError(f"{kind.name} needs src {{N, C, spatial...}}, got {src.describe()}")
    s = _spatial("strides", strides, spatial, 1)
    pl = _spatial("padding_l", padding_l, spatial, 0)
    pr = _spatial("padding_r", padding_r, spatial, 0)
    d = _spatial("dilation", dilation, spatial, 0)
    attr = attr or PrimitiveAttr()
    engine = engine or default_engine()
    is_conv = kind == PrimitiveKind.convolution
    call = ("dnnl_convolution_forward_primitive_desc_create" if is_conv
            else "dnnl_deconvolution_forward_primitive_desc_create")
    alg = Alg.convolution_direct if is_conv else Alg.deconvolution_direct
    handle = c_void_p()
    status = getattr(C, call)(byref(handle), engine.handle, prop_kind, alg, src.handle,
                              weights.handle, _h(bias), dst.handle, _lib.dims(s), _lib.dims(d),
                              _lib.dims(pl), _lib.dims(pr), attr.handle)
    detail = (_desc(src=src, weights=weights, bias=bias, dst=dst)
              + f" strides={s} dilation={d} padding_l={pl} padding_r={pr}")
    return _finish(kind, call, status, handle, attr, engine, detail)


def convolution(src: MemoryDesc, weights: MemoryDesc, dst: MemoryDesc, *,
                bias: MemoryDesc | None = None, strides: Ints | None = None,
                padding_l: Ints | None = None, padding_r: Ints | None = None,
                dilation: Ints | None = None, attr: PrimitiveAttr | None = None,
                engine: Engine | None = None, prop_kind: PropKind = INFERENCE) -> PrimitiveDesc:
    """Direct convolution; groups through 5-D weights {G, O/G, I/G, kh, kw}."""
    return _conv_like(PrimitiveKind.convolution, src, weights, dst, bias, strides, padding_l,
                      padding_r, dilation, attr, engine, prop_kind)


def deconvolution(src: MemoryDesc, weights: MemoryDesc, dst: MemoryDesc, *,
                  bias: MemoryDesc | None = None, strides: Ints | None = None,
                  padding_l: Ints | None = None, padding_r: Ints | None = None,
                  dilation: Ints | None = None, attr: PrimitiveAttr | None = None,
                  engine: Engine | None = None, prop_kind: PropKind = INFERENCE) -> PrimitiveDesc:
    """Direct deconvolution (transposed convolution); weights {[G,] O, I, kh, kw}."""
    return _conv_like(PrimitiveKind.deconvolution, src, weights, dst, bias, strides, padding_l,
                      padding_r, dilation, attr, engine, prop_kind)


def inner_product(src: MemoryDesc, weights: MemoryDesc, dst: MemoryDesc, *,
                  bias: MemoryDesc | None = None, attr: PrimitiveAttr | None = None,
                  engine: Engine | None = None, prop_kind: PropKind = INFERENCE) -> PrimitiveDesc:
    """dst{N, O} = src{N, I...} x weights{O, I...}^T (+ bias{O})."""
    attr = attr or PrimitiveAttr()
    engine = engine or default_engine()
    handle = c_void_p()
    call = "dnnl_inner_product_forward_primitive_desc_create"
    status = C.dnnl_inner_product_forward_primitive_desc_create(
        byref(handle), engine.handle, prop_kind, src.handle, weights.handle, _h(bias),
        dst.handle, attr.handle)
    return _finish(PrimitiveKind.inner_product, call, status, handle, attr, engine,
                   _desc(src=src, weights=weights, bias=bias, dst=dst))


def matmul(src: MemoryDesc, weights: MemoryDesc, dst: MemoryDesc, *,
           bias: MemoryDesc | None = None, attr: PrimitiveAttr | None = None,
           engine: Engine | None = None) -> PrimitiveDesc:
    """dst{..., M, N} = src{..., M, K} x weights{..., K, N} (+ bias), batch dims broadcast."""
    attr = attr or PrimitiveAttr()
    engine = engine or default_engine()
    handle = c_void_p()
    status = C.dnnl_matmul_primitive_desc_create(byref(handle), engine.handle, src.handle,
                                                 weights.handle, _h(bias), dst.handle,
                                                 attr.handle)
    return _finish(PrimitiveKind.matmul, "dnnl_matmul_primitive_desc_create", status, handle,
                   attr, engine, _desc(src=src, weights=weights, bias=bias, dst=dst))


def pooling(alg: Alg, src: MemoryDesc, dst: MemoryDesc, *, kernel: Ints,
            strides: Ints | None = None, padding_l: Ints | None = None,
            padding_r: Ints | None = None, dilation: Ints | None = None,
            attr: PrimitiveAttr | None = None, engine: Engine | None = None,
            prop_kind: PropKind = INFERENCE) -> PrimitiveDesc:
    """Max or average pooling (average including or excluding padded taps)."""
    if alg not in POOLING_ALGS:
        raise ValueError(f"{alg!r} is not a pooling algorithm")
    spatial = src.ndims - 2
    k = _spatial("kernel", kernel, spatial, 1)
    s = _spatial("strides", strides, spatial, 1)
    pl = _spatial("padding_l", padding_l, spatial, 0)
    pr = _spatial("padding_r", padding_r, spatial, 0)
    d = _spatial("dilation", dilation, spatial, 0)
    attr = attr or PrimitiveAttr()
    engine = engine or default_engine()
    handle = c_void_p()
    status = C.dnnl_pooling_forward_primitive_desc_create(
        byref(handle), engine.handle, prop_kind, alg, src.handle, dst.handle, _lib.dims(s),
        _lib.dims(k), _lib.dims(d), _lib.dims(pl), _lib.dims(pr), attr.handle)
    detail = (f"{Alg(alg).name} " + _desc(src=src, dst=dst)
              + f" kernel={k} strides={s} dilation={d} padding_l={pl} padding_r={pr}")
    return _finish(PrimitiveKind.pooling, "dnnl_pooling_forward_primitive_desc_create", status,
                   handle, attr, engine, detail)


def eltwise(alg: Alg, src: MemoryDesc, dst: MemoryDesc | None = None, *, alpha: float = 0.0,
            beta: float = 0.0, attr: PrimitiveAttr | None = None, engine: Engine | None = None,
            prop_kind: PropKind = INFERENCE) -> PrimitiveDesc:
    """dst = alg(src; alpha, beta); dst defaults to src's descriptor."""
    if alg not in ELTWISE_ALGS:
        raise ValueError(f"{alg!r} is not an eltwise algorithm")
    dst = dst or src
    attr = attr or PrimitiveAttr()
    engine = engine or default_engine()
    handle = c_void_p()
    status = C.dnnl_eltwise_forward_primitive_desc_create(
        byref(handle), engine.handle, prop_kind, alg, src.handle, dst.handle, alpha, beta,
        attr.handle)
    detail = f"{Alg(alg).name} alpha={alpha} beta={beta} " + _desc(src=src, dst=dst)
    return _finish(PrimitiveKind.eltwise, "dnnl_eltwise_forward_primitive_desc_create", status,
                   handle, attr, engine, detail)


def binary(alg: Alg, src0: MemoryDesc, src1: MemoryDesc, dst: MemoryDesc, *,
           attr: PrimitiveAttr | None = None, engine: Engine | None = None,
           align: bool = True) -> PrimitiveDesc:
    """dst = alg(src0, src1), src1 broadcast along its size-1 dims. A full-size src1 is taken
    with src0's strides on its size-1 dims (``MemoryDesc.size1_strides_of``: oneDNN 3.2's jit
    binary computes wrong when they differ); a memory of the given descriptor still binds
    (oneDNN calls the two equal). src0 and dst are left as given: a single pixel's
    per-channel post-op operand is right only in the dst's own strides (compiler/lower/
    attrs.py). ``align=False`` passes src1 as given (the test that measures the pitfall)."""
    attr = attr or PrimitiveAttr()
    engine = engine or default_engine()
    if align:
        src1 = src1.size1_strides_of(src0)
    handle = c_void_p()
    status = C.dnnl_binary_primitive_desc_create(byref(handle), engine.handle, alg,
                                                 src0.handle, src1.handle, dst.handle,
                                                 attr.handle)
    detail = f"{Alg(alg).name} " + _desc(src0=src0, src1=src1, dst=dst)
    return _finish(PrimitiveKind.binary, "dnnl_binary_primitive_desc_create", status, handle,
                   attr, engine, detail)


def reorder(src: MemoryDesc, dst: MemoryDesc, *, attr: PrimitiveAttr | None = None,
            engine: Engine | None = None) -> PrimitiveDesc:
    """Layout / data-type conversion. With scales: dst = saturate(rint(src * s_src / s_dst))
    (+ zero points), e.g. quantize (src f32, dst scale) or requantize (both scales)."""
    attr = attr or PrimitiveAttr()
    engine = engine or default_engine()
    handle = c_void_p()
    status = C.dnnl_reorder_primitive_desc_create(byref(handle), src.handle, engine.handle,
                                                  dst.handle, engine.handle, attr.handle)
    return _finish(PrimitiveKind.reorder, "dnnl_reorder_primitive_desc_create", status, handle,
                   attr, engine, _desc(src=src, dst=dst))


def concat(srcs: Sequence[MemoryDesc], axis: int, dst: MemoryDesc | None = None, *,
           attr: PrimitiveAttr | None = None, engine: Engine | None = None) -> PrimitiveDesc:
    """Concatenate N inputs (args MULTIPLE_SRC + i) along `axis`; dst None: library's choice."""
    if not srcs:
        raise ValueError("concat needs at least one input")
    attr = attr or PrimitiveAttr()
    engine = engine or default_engine()
    handles = (c_void_p * len(srcs))(*(md.handle.value for md in srcs))
    handle = c_void_p()
    status = C.dnnl_concat_primitive_desc_create(byref(handle), engine.handle, _h(dst),
                                                 len(srcs), int(axis), handles, attr.handle)
    detail = (f"axis={axis} " + " ".join(f"src{i}={md.describe()}" for i, md in enumerate(srcs))
              + " " + _desc(dst=dst))
    return _finish(PrimitiveKind.concat, "dnnl_concat_primitive_desc_create", status, handle,
                   attr, engine, detail)


def resampling(alg: Alg, src: MemoryDesc, dst: MemoryDesc, *,
               factors: Sequence[float] | None = None, attr: PrimitiveAttr | None = None,
               engine: Engine | None = None, prop_kind: PropKind = INFERENCE) -> PrimitiveDesc:
    """Nearest or linear resampling of the spatial dims of src {N, C, [D,] [H,] W} to dst's.

    ``factors`` (one per spatial dim) default to dst/src (NULL in C). oneDNN maps an output
    index o to the source coordinate ``(o + 0.5)·in/out - 0.5`` in f32: nearest takes its
    roundf (halves away from zero), linear interpolates the two neighbours (clamped to the
    edge). u8/s8 dst rounds half to even and saturates on store. The factors do not enter
    the computation in 3.2 (runtime/onednn/reference.py models it)."""
    if alg not in RESAMPLING_ALGS:
        raise ValueError(f"{alg!r} is not a resampling algorithm")
    spatial = src.ndims - 2
    if spatial < 1 or dst.ndims != src.ndims:
        raise ValueError(f"resampling needs src and dst {{N, C, spatial...}}, got "
                         f"{src.describe()} and {dst.describe()}")
    attr = attr or PrimitiveAttr()
    engine = engine or default_engine()
    c_factors = None
    if factors is not None:
        values = tuple(float(f) for f in factors)
        if len(values) != spatial:
            raise ValueError(f"factors needs {spatial} spatial values, got {values}")
        c_factors = (c_float * spatial)(*values)
    handle = c_void_p()
    status = C.dnnl_resampling_forward_primitive_desc_create(
        byref(handle), engine.handle, prop_kind, alg, c_factors, src.handle, dst.handle,
        attr.handle)
    detail = (f"{Alg(alg).name} " + _desc(src=src, dst=dst)
              + ("" if factors is None else f" factors={tuple(factors)}"))
    return _finish(PrimitiveKind.resampling, "dnnl_resampling_forward_primitive_desc_create",
                   status, handle, attr, engine, detail)


def softmax(src: MemoryDesc, dst: MemoryDesc | None = None, *, axis: int,
            alg: Alg = Alg.softmax_accurate, attr: PrimitiveAttr | None = None,
            engine: Engine | None = None, prop_kind: PropKind = INFERENCE) -> PrimitiveDesc:
    """Softmax (accurate: exp(x - max) / sum) or log-softmax along `axis`."""
    if alg not in SOFTMAX_ALGS:
        raise ValueError(f"{alg!r} is not a softmax algorithm")
    dst = dst or src
    attr = attr or PrimitiveAttr()
    engine = engine or default_engine()
    handle = c_void_p()
    status = C.dnnl_softmax_forward_primitive_desc_create(
        byref(handle), engine.handle, prop_kind, alg, src.handle, dst.handle, int(axis),
        attr.handle)
    detail = f"{Alg(alg).name} axis={axis} " + _desc(src=src, dst=dst)
    return _finish(PrimitiveKind.softmax, "dnnl_softmax_forward_primitive_desc_create", status,
                   handle, attr, engine, detail)


def layer_normalization(src: MemoryDesc, dst: MemoryDesc | None = None, *,
                        epsilon: float = 1e-5, use_scale: bool = False, use_shift: bool = False,
                        use_global_stats: bool = False, stat: MemoryDesc | None = None,
                        attr: PrimitiveAttr | None = None, engine: Engine | None = None,
                        prop_kind: PropKind = INFERENCE) -> PrimitiveDesc:
    """Normalize over the last dim: dst = (src - mean) / sqrt(var + eps) * scale + shift.

    SCALE / SHIFT are f32 {C} args when enabled; with use_global_stats MEAN / VARIANCE are
    inputs (stat defaults to src's dims without the last one)."""
    flags = NormFlags.none
    flags |= NormFlags.use_scale if use_scale else NormFlags.none
    flags |= NormFlags.use_shift if use_shift else NormFlags.none
    flags |= NormFlags.use_global_stats if use_global_stats else NormFlags.none
    dst = dst or src
    attr = attr or PrimitiveAttr()
    engine = engine or default_engine()
    handle = c_void_p()
    call = "dnnl_layer_normalization_forward_primitive_desc_create"
    status = C.dnnl_layer_normalization_forward_primitive_desc_create(
        byref(handle), engine.handle, prop_kind, src.handle, dst.handle, _h(stat), epsilon,
        int(flags), attr.handle)
    detail = f"epsilon={epsilon} flags={flags!r} " + _desc(src=src, dst=dst, stat=stat)
    return _finish(PrimitiveKind.layer_normalization, call, status, handle, attr, engine,
                   detail)


def reduction(alg: Alg, src: MemoryDesc, dst: MemoryDesc, *, p: float = 0.0, eps: float = 0.0,
              attr: PrimitiveAttr | None = None, engine: Engine | None = None) -> PrimitiveDesc:
    """Reduce src over the dims where dst has size 1 (same rank; oneDNN 3.2 dev guide,
    "Reduction"): max, min, sum, mul (product), mean (sum / R); with ``p`` and ``eps``

        norm_lp_max          (max(Σ|x|^p, eps))^(1/p)    norm_lp_sum          (Σ|x|^p + eps)^(1/p)
        norm_lp_power_p_max   max(Σ|x|^p, eps)           norm_lp_power_p_sum   Σ|x|^p + eps

    (p and eps are ignored by the other algorithms). No prop_kind: reduction has no backward."""
    if alg not in REDUCTION_ALGS:
        raise ValueError(f"{alg!r} is not a reduction algorithm")
    if dst.ndims != src.ndims:
        raise ValueError(f"reduction needs src and dst of the same rank, got {src.describe()} "
                         f"and {dst.describe()}")
    attr = attr or PrimitiveAttr()
    engine = engine or default_engine()
    handle = c_void_p()
    status = C.dnnl_reduction_primitive_desc_create(
        byref(handle), engine.handle, alg, src.handle, dst.handle, float(p), float(eps),
        attr.handle)
    detail = f"{Alg(alg).name} p={p} eps={eps} " + _desc(src=src, dst=dst)
    return _finish(PrimitiveKind.reduction, "dnnl_reduction_primitive_desc_create", status,
                   handle, attr, engine, detail)


def lrn(src: MemoryDesc, dst: MemoryDesc | None = None, *, local_size: int, alpha: float,
        beta: float, k: float, alg: Alg = Alg.lrn_across_channels,
        attr: PrimitiveAttr | None = None, engine: Engine | None = None,
        prop_kind: PropKind = INFERENCE) -> PrimitiveDesc:
    """Local response normalization (oneDNN 3.2 dev guide, "LRN"), across channels:

        dst(n, c, ...) = src(n, c, ...) · (k + alpha/local_size · Σ_i src(n, c + i, ...)²)^-beta

    i from -(local_size - 1)/2 (C division) over local_size channels, clipped at the edges,
    the divisor local_size either way; within channel the window is spatial (local_size per
    spatial dim, divisor local_size^spatial). dst defaults to src's descriptor."""
    if alg not in LRN_ALGS:
        raise ValueError(f"{alg!r} is not an LRN algorithm")
    if local_size < 1:
        raise ValueError(f"local_size must be >= 1, got {local_size}")
    dst = dst or src
    attr = attr or PrimitiveAttr()
    engine = engine or default_engine()
    handle = c_void_p()
    status = C.dnnl_lrn_forward_primitive_desc_create(
        byref(handle), engine.handle, prop_kind, alg, src.handle, dst.handle, int(local_size),
        float(alpha), float(beta), float(k), attr.handle)
    detail = (f"{Alg(alg).name} local_size={local_size} alpha={alpha} beta={beta} k={k} "
              + _desc(src=src, dst=dst))
    return _finish(PrimitiveKind.lrn, "dnnl_lrn_forward_primitive_desc_create", status, handle,
                   attr, engine, detail)


def rnn(cell: Alg, direction: RnnDirection, src_layer: MemoryDesc, weights_layer: MemoryDesc,
        weights_iter: MemoryDesc, dst_layer: MemoryDesc, *, src_iter: MemoryDesc | None = None,
        src_iter_c: MemoryDesc | None = None, bias: MemoryDesc | None = None,
        dst_iter: MemoryDesc | None = None, dst_iter_c: MemoryDesc | None = None,
        weights_peephole: MemoryDesc | None = None, activation: Alg = Alg.eltwise_tanh,
        alpha: float = 0.0, attr: PrimitiveAttr | None = None, engine: Engine | None = None,
        prop_kind: PropKind = INFERENCE) -> PrimitiveDesc:
    """One recurrent layer over a whole sequence (oneDNN 3.2 dev guide, "RNN"): `cell` is
    vanilla_rnn (one gate, `activation` tanh / relu (slope `alpha`) / logistic), vanilla_lstm
    (gates i, f, c~, o; `weights_peephole` {L, D, 3, O} for i, f, o), vanilla_gru (u, r, o)
    or lbr_gru (u, r, o with the reset applied after the recurrent product; bias has a 4th
    gate, that product's bias).

    Descriptors, L layers (1 here), D directions, T steps, N batch, I input and O hidden
    channels, G gates: src_layer {T, N, I} (tnc / ntc), src_iter / dst_iter {L, D, N, O},
    src_iter_c / dst_iter_c {L, D, N, O} (LSTM's cell state), weights_layer {L, D, I, G, O},
    weights_iter {L, D, O, G, O}, bias {L, D, G, O}, dst_layer {T, N, O} (D·O for
    bidirectional_concat). A missing src_iter / bias is zero, a missing dst_iter not
    written. Execution arguments: SRC_LAYER = SRC (1), SRC_ITER = SRC_1, SRC_ITER_C = SRC_2,
    WEIGHTS_LAYER = WEIGHTS, WEIGHTS_ITER = WEIGHTS_1, WEIGHTS_PEEPHOLE = WEIGHTS_2,
    BIAS, DST_LAYER = DST, DST_ITER = DST_1, DST_ITER_C = DST_2."""
    if cell not in RNN_CELL_ALGS:
        raise ValueError(f"{cell!r} is not a recurrent cell")
    if (src_iter_c is not None or dst_iter_c is not None or weights_peephole is not None) \
            and cell != Alg.vanilla_lstm:
        raise ValueError(f"{cell.name} has no cell state and no peephole weights")
    attr = attr or PrimitiveAttr()
    engine = engine or default_engine()
    handle = c_void_p()
    common = (byref(handle), engine.handle, prop_kind)
    if cell == Alg.vanilla_rnn:
        call = "dnnl_vanilla_rnn_forward_primitive_desc_create"
        status = C.dnnl_vanilla_rnn_forward_primitive_desc_create(
            *common, activation, direction, src_layer.handle, _h(src_iter),
            weights_layer.handle, weights_iter.handle, _h(bias), dst_layer.handle,
            _h(dst_iter), 0, float(alpha), 0.0, attr.handle)
    elif cell == Alg.vanilla_lstm:
        call = "dnnl_lstm_forward_primitive_desc_create"
        status = C.dnnl_lstm_forward_primitive_desc_create(
            *common, direction, src_layer.handle, _h(src_iter), _h(src_iter_c),
            weights_layer.handle, weights_iter.handle, _h(weights_peephole), None, _h(bias),
            dst_layer.handle, _h(dst_iter), _h(dst_iter_c), 0, attr.handle)
    else:
        call = ("dnnl_gru_forward_primitive_desc_create" if cell == Alg.vanilla_gru
                else "dnnl_lbr_gru_forward_primitive_desc_create")
        status = getattr(C, call)(
            *common, direction, src_layer.handle, _h(src_iter), weights_layer.handle,
            weights_iter.handle, _h(bias), dst_layer.handle, _h(dst_iter), 0, attr.handle)
    detail = (f"{cell.name} {direction.name}"
              + (f" {activation.name} alpha={alpha}" if cell == Alg.vanilla_rnn else "") + " "
              + _desc(src_layer=src_layer, src_iter=src_iter, src_iter_c=src_iter_c,
                      weights_layer=weights_layer, weights_iter=weights_iter,
                      weights_peephole=weights_peephole, bias=bias, dst_layer=dst_layer,
                      dst_iter=dst_iter, dst_iter_c=dst_iter_c))
    return _finish(PrimitiveKind.rnn, call, status, handle, attr, engine, detail)


def filled(md: MemoryDesc, values: np.ndarray, *, engine: Engine | None = None) -> Memory:
    """A new Memory of descriptor `md` holding the plain array `values`.

    Plain descriptors are written directly; any other layout (blocked weights chosen through
    FormatTag.any, which for int8 carry compensation data after the values) is filled by a
    reorder from a plain descriptor of `values` — never by a memcpy."""
    engine = engine or default_engine()
    values = np.ascontiguousarray(values)
    if data_type_of(values.dtype) != md.dtype or values.shape != md.dims:
        raise ValueError(f"cannot fill {md.describe()} from {values.dtype} {values.shape}")
    memory = Memory(md, engine=engine)
    if md.is_plain:
        memory.write(values)
        return memory
    source = Memory.from_array(values, engine)
    copy = reorder(source.md, md, engine=engine).create()
    copy.execute(copy.with_scratchpad({Arg.SRC: source, Arg.DST: memory}))
    return memory
