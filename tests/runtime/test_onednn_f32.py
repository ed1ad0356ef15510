"""Every primitive of the binding in f32 (and the reorder's int8 conversions) against numpy.

Tolerances, stated once:
- Sums of products (conv, deconv, inner product, matmul): |got - ref| <= 1e-5 * sum|x*w| per
  output (the f32 error of a reordered sum of n <= ~600 terms is below n * 2^-24 of that sum;
  1e-5 is ~170 ulps of it, far above the ~sqrt(n) ulps seen, far below any indexing error).
- Exact operations: 0 (relu, linear, clip, round, abs, square, sqrt; binary add/sub/mul/max/
  min/div; max pooling; concat; reorders, including f32 <-> int8 with scales, which are checked
  bit-exact against the f32 model in the test).
- Transcendental eltwise (oneDNN uses polynomial approximations): |got - ref| <= 1e-6 + 2e-6*|ref|
  against float64 formulas; log 4e-6 + 2e-6*|ref| (its approximation error is absolute, up to
  3.6e-6 measured on [0.05, 6]; the others stay under 1e-6 absolute, gelu_erf 9.5e-7).
- Average pooling, softmax, layer normalization: 2e-6 * max(1, |ref|) (a few f32 roundings);
  log-softmax 4e-6 + 2e-6*|ref| (the log approximation again).
"""

from __future__ import annotations

import numpy as np
import pytest

from qfuse.runtime.onednn import (
    ELTWISE_ALGS,
    Alg,
    Arg,
    DataType,
    FormatTag,
    Memory,
    MemoryDesc,
    PostOps,
    PrimitiveAttr,
    PrimitiveDesc,
    binary,
    concat,
    convolution,
    deconvolution,
    eltwise,
    inner_product,
    layer_normalization,
    matmul,
    pooling,
    reorder,
    softmax,
)
from qfuse.runtime.onednn import reference as ref

F32 = np.float32
RNG = np.random.default_rng(1234)


def f32(*shape: int, lo: float = -1.0, hi: float = 1.0) -> np.ndarray:
    return RNG.uniform(lo, hi, shape).astype(F32)


def md(array_or_shape: np.ndarray | tuple[int, ...], tag: FormatTag | None = None,
       dt: DataType = DataType.f32) -> MemoryDesc:
    shape = array_or_shape if isinstance(array_or_shape, tuple) else array_or_shape.shape
    return MemoryDesc.from_tag(shape, dt, tag)


def run(pd: PrimitiveDesc, inputs: dict[int, np.ndarray]) -> np.ndarray:
    """Execute with plain memories over `inputs`; return DST as a numpy array."""
    primitive = pd.create()
    args = {arg: Memory.from_array(np.ascontiguousarray(a)) for arg, a in inputs.items()}
    dst_md = pd.dst_md
    assert dst_md is not None
    args[Arg.DST] = Memory(dst_md)
    primitive.execute(primitive.with_scratchpad(args))
    return args[Arg.DST].read()


def assert_sum_close(got: np.ndarray, expected: np.ndarray, magnitude: np.ndarray) -> None:
    assert got.shape == expected.shape
    assert np.all(np.abs(got - expected) <= 1e-5 * magnitude + 1e-30)


CONV_GEOMETRIES = [
    # (C, O, groups, spatial, kernel, strides, dilation, padding_l, padding_r)
    (8, 16, 1, (10, 9), (3, 3), (1, 1), (0, 0), (1, 1), (1, 1)),
    (8, 12, 4, (11, 10), (3, 2), (2, 1), (1, 0), (1, 0), (2, 1)),
    (16, 16, 16, (9, 9), (3, 3), (1, 1), (0, 0), (1, 1), (1, 1)),  # depthwise
    (6, 4, 1, (7, 8), (1, 1), (2, 2), (0, 0), (0, 0), (0, 0)),
]


@pytest.mark.parametrize("geometry", CONV_GEOMETRIES)
@pytest.mark.parametrize("deconv", [False, True], ids=["conv", "deconv"])
def test_conv_and_deconv(geometry: tuple, deconv: bool) -> None:
    c, o, g, spatial, kernel, strides, dilation, pl, pr = geometry
    x = f32(2, c, *spatial)
    w = f32(g, o // g, c // g, *kernel) if g > 1 else f32(o, c, *kernel)
    bias = f32(o)
    geo = {"strides": strides, "dilation": dilation, "padding_l": pl, "padding_r": pr}
    acc = (ref.deconv_acc if deconv else ref.conv_acc)
    expected = acc(x, w, **geo) + bias.reshape(1, o, 1, 1)
    magnitude = acc(np.abs(x), np.abs(w), **geo) + np.abs(bias).reshape(1, o, 1, 1)
    make = deconvolution if deconv else convolution
    pd = make(md(x), md(w), md(expected.shape), bias=md(bias), **geo)
    got = run(pd, {Arg.SRC: x, Arg.WEIGHTS: w, Arg.BIAS: bias})
    assert_sum_close(got, expected, magnitude)


def test_conv_without_bias_nhwc() -> None:
    x, w = f32(1, 8, 6, 6), f32(8, 8, 3, 3)
    expected = ref.conv_acc(x, w)
    pd = convolution(md(x, FormatTag.nhwc), md(w), md(expected.shape, FormatTag.nhwc))
    assert pd.arg_md(Arg.BIAS) is None
    primitive = pd.create()
    src = Memory(pd.src_md)  # nhwc
    src.write(x)
    dst = Memory(pd.dst_md)
    primitive.execute(primitive.with_scratchpad(
        {Arg.SRC: src, Arg.WEIGHTS: Memory.from_array(w), Arg.DST: dst}))
    assert_sum_close(dst.read(), expected, ref.conv_acc(np.abs(x), np.abs(w)))


@pytest.mark.parametrize("src_shape", [(4, 32), (3, 4, 5, 5)])
def test_inner_product(src_shape: tuple[int, ...]) -> None:
    x = f32(*src_shape)
    w = f32(24, *src_shape[1:])
    bias = f32(24)
    expected = ref.inner_product_acc(x, w) + bias
    pd = inner_product(md(x), md(w), md((src_shape[0], 24)), bias=md(bias))
    got = run(pd, {Arg.SRC: x, Arg.WEIGHTS: w, Arg.BIAS: bias})
    assert_sum_close(got, expected, ref.inner_product_acc(np.abs(x), np.abs(w)) + np.abs(bias))


@pytest.mark.parametrize(("a_shape", "b_shape", "bias_shape"), [
    ((7, 33), (33, 20), (1, 20)),
    ((3, 5, 16), (3, 16, 8), (1, 1, 8)),
    ((4, 5, 16), (1, 16, 8), (4, 5, 8)),  # weights broadcast over the batch, full bias
    ((2, 1, 6, 16), (1, 3, 16, 4), None),  # both operands broadcast
])
def test_matmul(a_shape: tuple[int, ...], b_shape: tuple[int, ...],
                bias_shape: tuple[int, ...] | None) -> None:
    a, b = f32(*a_shape), f32(*b_shape)
    expected = ref.matmul_acc(a, b)
    magnitude = ref.matmul_acc(np.abs(a), np.abs(b))
    inputs = {Arg.SRC: a, Arg.WEIGHTS: b}
    if bias_shape is not None:
        bias = f32(*bias_shape)
        inputs[Arg.BIAS] = bias
        expected, magnitude = expected + bias, magnitude + np.abs(bias)
    pd = matmul(md(a), md(b), md(expected.shape),
                bias=md(bias_shape) if bias_shape else None)
    assert_sum_close(run(pd, inputs), expected, magnitude)


def pool_reference(x: np.ndarray, alg: Alg, kernel: tuple[int, int], strides: tuple[int, int],
                   dilation: tuple[int, int], pl: tuple[int, int],
                   pr: tuple[int, int]) -> np.ndarray:
    fill = -np.inf if alg == Alg.pooling_max else np.nan
    padded = np.pad(x.astype(np.float64), [(0, 0), (0, 0), *zip(pl, pr, strict=True)],
                    constant_values=fill)
    out = [(x.shape[2 + i] + pl[i] + pr[i] - ((kernel[i] - 1) * (dilation[i] + 1) + 1))
           // strides[i] + 1 for i in range(2)]
    taps = np.stack([padded[:, :, kh * (dilation[0] + 1)::strides[0],
                            kw * (dilation[1] + 1)::strides[1]][:, :, :out[0], :out[1]]
                     for kh in range(kernel[0]) for kw in range(kernel[1])])
    if alg == Alg.pooling_max:
        return taps.max(axis=0)
    if alg == Alg.pooling_avg_exclude_padding:
        return np.nanmean(taps, axis=0)
    return np.nansum(taps, axis=0) / (kernel[0] * kernel[1])


@pytest.mark.parametrize("alg", sorted(a for a in Alg if a.name.startswith("pooling_")))
@pytest.mark.parametrize(("kernel", "strides", "dilation", "pl", "pr"), [
    ((3, 3), (2, 2), (0, 0), (1, 1), (1, 1)),
    ((2, 3), (1, 2), (1, 0), (0, 1), (1, 2)),
])
def test_pooling(alg: Alg, kernel: tuple[int, int], strides: tuple[int, int],
                 dilation: tuple[int, int], pl: tuple[int, int], pr: tuple[int, int]) -> None:
    x = f32(2, 8, 9, 10)
    expected = pool_reference(x, alg, kernel, strides, dilation, pl, pr)
    pd = pooling(alg, md(x), md(expected.shape), kernel=kernel, strides=strides,
                 dilation=dilation, padding_l=pl, padding_r=pr)
    got = run(pd, {Arg.SRC: x})
    tolerance = 0.0 if alg == Alg.pooling_max else 2e-6
    assert np.all(np.abs(got - expected) <= tolerance * np.maximum(1.0, np.abs(expected)))


ELTWISE_PARAMS = {
    Alg.eltwise_relu: (0.1, 0.0), Alg.eltwise_elu: (0.7, 0.0), Alg.eltwise_linear: (0.7, -0.3),
    Alg.eltwise_soft_relu: (1.0, 0.0), Alg.eltwise_hardsigmoid: (1 / 6, 0.5),
    Alg.eltwise_swish: (1.2, 0.0), Alg.eltwise_clip: (-1.0, 2.0),
    Alg.eltwise_clip_v2: (-1.0, 2.0), Alg.eltwise_pow: (0.9, 1.7),
    Alg.eltwise_hardswish: (1 / 6, 0.5),
}
EXACT_ELTWISE = {Alg.eltwise_relu, Alg.eltwise_linear, Alg.eltwise_clip, Alg.eltwise_clip_v2,
                 Alg.eltwise_round, Alg.eltwise_abs, Alg.eltwise_square, Alg.eltwise_sqrt}
POSITIVE_DOMAIN = {Alg.eltwise_log, Alg.eltwise_sqrt, Alg.eltwise_pow}


@pytest.mark.parametrize("alg", sorted(ELTWISE_ALGS), ids=lambda a: a.name)
def test_eltwise(alg: Alg) -> None:
    x = f32(2, 8, 12, 12, lo=-6.0, hi=6.0)
    if alg in POSITIVE_DOMAIN:
        x = np.abs(x) + F32(0.05)
    alpha, beta = ELTWISE_PARAMS.get(alg, (0.0, 0.0))
    got = run(eltwise(alg, md(x), alpha=alpha, beta=beta), {Arg.SRC: x})
    # float64 formulas (gelu_erf through math.erf, vectorized), rounded to f32 only for the
    # exact ops, where oneDNN's own f32 rounding is the reference
    expected = ref.eltwise(x, alg, alpha, beta).astype(np.float64)
    error = np.abs(got - expected)
    if alg in EXACT_ELTWISE:
        assert error.max() == 0, alg.name
    else:
        atol = 4e-6 if alg == Alg.eltwise_log else 1e-6
        assert np.all(error <= atol + 2e-6 * np.abs(expected)), (alg.name, error.max())


BINARY_CASES = [((2, 8, 5, 5), (2, 8, 5, 5)), ((2, 8, 5, 5), (1, 8, 1, 1)),
                ((2, 8, 5, 5), (1, 1, 1, 1)), ((4, 6), (4, 1))]


@pytest.mark.parametrize("alg", sorted(a for a in Alg if a.name.startswith("binary_")),
                         ids=lambda a: a.name)
@pytest.mark.parametrize(("a_shape", "b_shape"), BINARY_CASES)
def test_binary(alg: Alg, a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> None:
    a, b = f32(*a_shape), f32(*b_shape, lo=0.5, hi=2.0)
    got = run(binary(alg, md(a), md(b), md(a)), {Arg.SRC_0: a, Arg.SRC_1: b})
    np.testing.assert_array_equal(got, ref.binary(alg, a, b))


@pytest.mark.parametrize("shape", [(2, 64, 1, 1), (3, 8, 1), (1, 64, 1, 1), (2, 64, 1, 2)])
def test_binary_per_channel_post_op_over_a_batch_of_single_pixels(shape: tuple[int, ...]) -> None:
    """oneDNN 3.2 pitfall the lowering works around (no_vnni.lower_with_binary and
    lower_batch_norm use (N, C) views): the jit binary primitive applies a per-channel binary
    post-op wrongly when N > 1 and every spatial dim is 1; right with N = 1, with a spatial
    dim > 1, and over the same data viewed as (N, C)."""
    a, b = f32(*shape), f32(*shape)
    channel = (1, shape[1]) + (1,) * (len(shape) - 2)
    m = f32(*channel, lo=0.5, hi=2.0)
    expected = (a + b) * m

    def with_post_op(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
        attr = PrimitiveAttr().set_post_ops(PostOps().append_binary(Alg.binary_mul, md(z)))
        return run(binary(Alg.binary_add, md(x), md(y), md(x), attr=attr),
                   {Arg.SRC_0: x, Arg.SRC_1: y, Arg.post_op(0, Arg.SRC_1): z})

    got = with_post_op(a, b, m)
    buggy = shape[0] > 1 and all(d == 1 for d in shape[2:])
    assert np.array_equal(got, expected) != buggy
    if not buggy:
        return
    flat = shape[:2]
    got = with_post_op(a.reshape(flat), b.reshape(flat), m.reshape(1, shape[1]))
    np.testing.assert_array_equal(got.reshape(shape), expected)


@pytest.mark.parametrize("order", [(1, 2, 3), (1, 3, 2), (2, 1, 3), (2, 3, 1), (3, 1, 2),
                                   (3, 2, 1)])
def test_binary_per_channel_post_op_with_the_channel_in_the_middle(order: tuple) -> None:
    """oneDNN 3.2 pitfall (ir/postops.channel_in_the_middle; found by tests/fuzz seed 8843):
    the jit binary primitive applies a per-channel binary post-op wrongly when the channel dim
    lies between other dims in memory, e.g. (N, H, C, W); right with C outermost after N or
    innermost. ``order``: memory order of dims 1..3, outermost first."""
    from qfuse.ir.postops import channel_in_the_middle

    shape = (1, 16, 3, 5)
    strides, step = [0] * 4, 1
    for d in reversed((0, *order)):
        strides[d], step = step, step * shape[d]
    a, b, m = f32(*shape), f32(*shape), f32(1, 16, 1, 1, lo=0.5, hi=2.0)
    x_md = MemoryDesc.from_strides(shape, DataType.f32, tuple(strides))
    attr = PrimitiveAttr().set_post_ops(PostOps().append_binary(Alg.binary_mul, md(m)))
    pd = binary(Alg.binary_add, x_md, x_md, x_md, attr=attr)
    primitive = pd.create()
    src0, src1, dst = Memory(x_md), Memory(x_md), Memory(x_md)
    src0.write(a)
    src1.write(b)
    primitive.execute(primitive.with_scratchpad({
        Arg.SRC_0: src0, Arg.SRC_1: src1, Arg.post_op(0, Arg.SRC_1): Memory.from_array(m),
        Arg.DST: dst}))
    middle = channel_in_the_middle(shape, tuple(strides))
    assert middle == (order[0] != 1 and order[-1] != 1)
    assert np.array_equal(dst.read(), (a + b) * m) != (middle and pd.impl_name.startswith("jit"))


def test_binary_operands_differing_in_a_size_one_stride() -> None:
    """oneDNN 3.2 pitfall (found when a slice of YOLOv8n's (1, 4, 2100) box tensor became a
    view): with src0 row-major (1, 2, 2100) and src1 the same but for its leading stride (8400,
    a slice's), descriptors oneDNN calls equal, the jit binary computes every row after the
    first wrong, silently; the primitive cache then hands that kernel to any later binary of
    the same key, dense ones included. ``binary`` gives src1 src0's size-1 strides
    (MemoryDesc.size1_strides_of): exact. Run with the cache off, so each primitive is its
    own."""
    from qfuse.runtime.onednn.threads import (
        primitive_cache_capacity,
        set_primitive_cache_capacity,
    )

    shape = (1, 2, 2100)
    a, b = f32(*shape), f32(*shape)
    dense = MemoryDesc.from_strides(shape, DataType.f32, (4200, 2100, 1))
    sliced = MemoryDesc.from_strides(shape, DataType.f32, (8400, 2100, 1))
    assert dense == sliced and sliced.size1_strides_of(dense).strides == dense.strides
    capacity = primitive_cache_capacity()
    set_primitive_cache_capacity(0)
    try:
        got = {}
        for align in (False, True):
            pd = binary(Alg.binary_sub, dense, sliced, dense, align=align)
            src0, src1, dst = Memory(dense), Memory(sliced), Memory(dense)
            src0.write(a)
            src1.write(b)
            primitive = pd.create()
            primitive.execute(primitive.with_scratchpad(
                {Arg.SRC_0: src0, Arg.SRC_1: src1, Arg.DST: dst}))
            got[align] = dst.read()
    finally:
        set_primitive_cache_capacity(capacity)
    assert np.array_equal(got[True], a - b)
    wrong = got[False] != a - b
    # if this fails, oneDNN computes it right: MemoryDesc.size1_strides_of's reason is gone
    assert not wrong[0, 0].any() and wrong[0, 1].mean() > 0.9


def test_reorder_layouts() -> None:
    x = f32(2, 5, 4, 3)
    pd = reorder(md(x), md(x, FormatTag.nhwc))
    primitive = pd.create()
    dst = Memory(pd.dst_md)
    primitive.execute(primitive.with_scratchpad({Arg.SRC: Memory.from_array(x), Arg.DST: dst}))
    np.testing.assert_array_equal(dst.array, x)  # logical view
    np.testing.assert_array_equal(dst.read(), x)
    raw = dst._buffer.view(np.float32).reshape(2, 4, 3, 5)  # physical nhwc order
    np.testing.assert_array_equal(raw, x.transpose(0, 2, 3, 1))


@pytest.mark.parametrize(("src_dt", "dst_dt"), [
    (DataType.f32, DataType.u8), (DataType.f32, DataType.s8), (DataType.s8, DataType.f32),
    (DataType.u8, DataType.s8), (DataType.s8, DataType.u8)])
def test_reorder_with_scales(src_dt: DataType, dst_dt: DataType) -> None:
    """quantize / dequantize / requantize: dst = saturate(rint(f32(f32(src * s_src) *
    f32(1/s_dst)) + zp_dst)) for int dst (zero point added in f32 before rounding), bit-exact;
    the inputs include exact ties (x.5 after scaling)."""
    if src_dt == DataType.f32:
        x = np.concatenate([f32(200, lo=-40, hi=40), np.arange(-20, 20, 0.5, dtype=F32)])
    else:
        info = np.iinfo(np.int8 if src_dt == DataType.s8 else np.uint8)
        x = np.arange(info.min, info.max + 1).astype(info.dtype)
    s_src, s_dst, zp_dst = F32(0.5 if src_dt == DataType.f32 else 0.37), F32(0.25), 3
    if dst_dt == DataType.f32:
        zp_dst = 0
    attr = PrimitiveAttr().set_scales_mask(Arg.SRC, 0).set_scales_mask(Arg.DST, 0)
    if zp_dst:
        attr.set_zero_points_mask(Arg.DST, 0)
    src_md, dst_md = md(x, dt=src_dt), md(x.shape, dt=dst_dt)
    primitive = reorder(src_md, dst_md, attr=attr).create()
    dst = Memory(dst_md)
    args = {Arg.SRC: Memory.from_array(x), Arg.DST: dst,
            Arg.scales(Arg.SRC): Memory.scales(s_src), Arg.scales(Arg.DST): Memory.scales(s_dst)}
    if zp_dst:
        args[Arg.zero_points(Arg.DST)] = Memory.zero_points(zp_dst)
    primitive.execute(primitive.with_scratchpad(args))
    target = {DataType.u8: np.uint8, DataType.s8: np.int8, DataType.f32: np.float32}[dst_dt]
    expected = ref.epilogue(x.astype(F32), target, src_scale=s_src, dst_scale=s_dst,
                            dst_zp=zp_dst)
    np.testing.assert_array_equal(dst.read(), expected)


def test_concat() -> None:
    parts = [f32(2, c, 4, 5) for c in (3, 1, 4)]
    pd = concat([md(p) for p in parts], axis=1)
    assert pd.dst_md is not None and pd.dst_md.dims == (2, 8, 4, 5)
    got = run(pd, {Arg.multiple_src(i): p for i, p in enumerate(parts)})
    np.testing.assert_array_equal(got, np.concatenate(parts, axis=1))
    rows = [f32(r, 6) for r in (2, 5)]
    got = run(concat([md(r) for r in rows], axis=0, dst=md((7, 6))),
              {Arg.multiple_src(i): r for i, r in enumerate(rows)})
    np.testing.assert_array_equal(got, np.concatenate(rows))


@pytest.mark.parametrize("alg", [Alg.softmax_accurate, Alg.softmax_log], ids=lambda a: a.name)
@pytest.mark.parametrize("axis", [1, 3])
def test_softmax(alg: Alg, axis: int) -> None:
    x = f32(2, 10, 3, 17, lo=-5, hi=5).astype(F32)
    d = x.astype(np.float64)
    shifted = d - d.max(axis=axis, keepdims=True)
    log_sum = np.log(np.exp(shifted).sum(axis=axis, keepdims=True))
    expected = shifted - log_sum if alg == Alg.softmax_log else np.exp(shifted - log_sum)
    got = run(softmax(md(x), axis=axis, alg=alg), {Arg.SRC: x})
    atol = 4e-6 if alg == Alg.softmax_log else 2e-6  # log's absolute error, as in eltwise
    assert np.all(np.abs(got - expected) <= atol + 2e-6 * np.abs(expected))


@pytest.mark.parametrize(("use_scale", "use_shift"), [(False, False), (True, True),
                                                      (True, False)])
def test_layer_normalization(use_scale: bool, use_shift: bool) -> None:
    x = f32(3, 5, 64, lo=-3, hi=5)
    gamma, beta = f32(64, lo=0.5, hi=1.5), f32(64)
    d = x.astype(np.float64)
    expected = (d - d.mean(-1, keepdims=True)) / np.sqrt(d.var(-1, keepdims=True) + 1e-5)
    inputs = {Arg.SRC: x}
    if use_scale:
        expected, inputs[Arg.SCALE] = expected * gamma, gamma
    if use_shift:
        expected, inputs[Arg.SHIFT] = expected + beta, beta
    pd = layer_normalization(md(x), epsilon=1e-5, use_scale=use_scale, use_shift=use_shift)
    assert (Arg.SCALE in pd.expected_args) == use_scale
    assert Arg.MEAN not in pd.expected_args  # inference computes statistics itself
    got = run(pd, inputs)
    assert np.all(np.abs(got - expected) <= 2e-6 * np.maximum(1.0, np.abs(expected)))


def test_layer_normalization_global_stats() -> None:
    x = f32(4, 32)
    mean, var = x.mean(-1).astype(F32), x.var(-1).astype(F32)
    pd = layer_normalization(md(x), epsilon=1e-3, use_global_stats=True)
    assert {Arg.MEAN, Arg.VARIANCE} <= set(pd.expected_args)
    got = run(pd, {Arg.SRC: x, Arg.MEAN: mean, Arg.VARIANCE: var})
    expected = (x - mean[:, None]) / np.sqrt(var[:, None].astype(np.float64) + 1e-3)
    assert np.all(np.abs(got - expected) <= 2e-6 * np.maximum(1.0, np.abs(expected)))
