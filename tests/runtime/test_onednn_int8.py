"""int8 convolution, deconvolution, inner product and matmul: bit-exact (0 LSB) against
runtime.onednn.reference, on full-range random data and on inputs built to sit on rounding ties.

The reference (measured here, see runtime/onednn/reference.py) is the int8 model of
docs/onednn.md, with two precisions: sum with a scale (and eltwise linear) is one FMA, and the dst zero point
is added in f32 *before* rounding, `saturate(rint(f32(x * f32(1/s_dst)) + zp_dst))`. The
ONNX-style form `rint(x/s_dst) + zp_dst` is off by 1 LSB on near-ties; `test_conv_rounding_ties`
builds such inputs and checks it both ways.

Tolerance is 0 LSB everywhere. What changes with the ISA is the int32 accumulator. With VNNI
or AMX (this machine: avx512_core_amx) it is exact. Without them — test_onednn_isa.py runs this
module again in a subprocess with ONEDNN_MAX_CPU_ISA=AVX2 — these models are measured to 0 LSB:
- u8 src, conv/deconv (jit_uni_int8:avx2) and GEMM kernels (gemm:jit, x64:gemm_s8u8s32:jit):
  vpmaddubsw adds the products of input channels (2i, 2i+1) (K positions 2i, 2i+1 for GEMM)
  into int16 with saturation before widening:
  `acc = sum(sat16(x[2i]*w[2i] + x[2i+1]*w[2i+1])) - zp_src*sum(w)`. Exact when no pair can
  leave int16, e.g. src <= 127 (`test_avx2_differs_from_exact_sum`).
- s8 src, conv: the weights reorder stores rint(w/2) and the kernel doubles the result
  (oneDNN's weight "scale_adjust" of 0.5 without VNNI): `acc = 2*sum((x - zp)*rint(w/2))`, so
  even small inputs differ from the exact sum. s8 src in GEMM kernels: src + 128 as u8, then
  the u8 rule, corrected by 128*sum(w).
- Depthwise conv multiplies in int32 (no pairs) and stays exact; many inner-product / matmul
  configurations fall back to ref:any under AVX2, which is exact.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

from qfuse.compiler.lower.no_vnni import SATURATING_ISAS, impl_is_exact
from qfuse.runtime.numerics import step_diff
from qfuse.runtime.onednn import (
    Alg,
    Arg,
    CpuIsa,
    DataType,
    FormatTag,
    Memory,
    MemoryDesc,
    PostOps,
    PrimitiveAttr,
    convolution,
    deconvolution,
    effective_cpu_isa,
    filled,
    inner_product,
    matmul,
)
from qfuse.runtime.onednn import reference as ref

ISA = effective_cpu_isa()
#: VNNI and AMX compute int8 dot products exactly; older ISAs go through int16 (see above).
EXACT_DOT_PRODUCTS = ISA in {CpuIsa.avx2_vnni, CpuIsa.avx2_vnni_2, CpuIsa.avx512_core_vnni,
                             CpuIsa.avx512_core_bf16, CpuIsa.avx512_core_fp16,
                             CpuIsa.avx512_core_amx, CpuIsa.avx512_core_amx_fp16}
#: Conv kernels expected: AMX, or VNNI for shapes the AMX kernels decline (small groups,
#: depthwise, deconvolution); without VNNI, the ISA's own kernels (e.g. jit_uni_int8:avx2).
IMPL_MARKS = ("amx", "vnni") if EXACT_DOT_PRODUCTS else (ISA.name,)
#: Set by test_onednn_isa.py together with ONEDNN_MAX_CPU_ISA.
REQUESTED_ISA = os.environ.get("QFUSE_ONEDNN_ISA")
NP = {DataType.u8: np.uint8, DataType.s8: np.int8, DataType.f32: np.float32}
F32 = np.float32


def rand_int(rng: np.random.Generator, dt: DataType, shape: tuple[int, ...],
             limit: int | None = None) -> np.ndarray:
    lo, hi = (0, 255) if dt == DataType.u8 else (-128, 127)
    if limit is not None:
        lo, hi = max(lo, -limit), min(hi, limit)
    return rng.integers(lo, hi + 1, shape).astype(NP[dt])


def conv_acc_model(src: np.ndarray, w: np.ndarray, zp: int, deconv: bool, exact_impl: bool,
                   **geometry: tuple[int, ...]) -> np.ndarray:
    """The accumulator the implementation computes (module docstring): exact, or summed in
    int16 pairs by a kernel without VNNI."""
    exact = ref.deconv_acc if deconv else ref.conv_acc
    if exact_impl:
        return exact(src, w, zp_src=zp, **geometry)
    if src.dtype == np.int8:
        halved = np.rint(w.astype(F32) * F32(0.5)).astype(np.int64)
        return 2 * exact(src, halved, zp_src=zp, **geometry)
    return saturated_pairs_acc(src, w, zp, exact, geometry)


def saturated_pairs_acc(src: np.ndarray, w: np.ndarray, zp: int,
                        exact: Callable[..., np.ndarray],
                        geometry: dict[str, tuple[int, ...]]) -> np.ndarray:
    """Sum over taps and input-channel pairs (2i, 2i+1) of sat16(x0*w0 + x1*w1) on raw u8 x,
    minus zp * sum(w) over the valid taps (the kernels correct the zero point exactly)."""
    grouped = w if w.ndim == src.ndim + 1 else w[None]
    n, cin = src.shape[0], grouped.shape[2]
    x = src.astype(np.int64).reshape(n, grouped.shape[0], cin, *src.shape[2:])
    total = np.int64(0)
    for first in range(0, cin, 2):
        pair = slice(first, first + 2)
        x_pair = x[:, :, pair].reshape(n, -1, *src.shape[2:])
        for tap in np.ndindex(*w.shape[-2:]):
            w_tap = np.zeros_like(grouped[:, :, pair])
            w_tap[(..., *tap)] = grouped[:, :, pair][(..., *tap)]
            total = total + np.clip(exact(x_pair, w_tap, **geometry), -32768, 32767)
    return total - zp * exact(np.ones_like(src), w, **geometry)


@dataclass(frozen=True)
class ConvCase:
    name: str
    c: int = 16
    o: int = 32
    spatial: tuple[int, int] = (9, 9)
    kernel: tuple[int, int] = (3, 3)
    groups: int = 1
    strides: tuple[int, int] = (1, 1)
    dilation: tuple[int, int] = (0, 0)
    padding_l: tuple[int, int] = (1, 1)
    padding_r: tuple[int, int] = (1, 1)
    src_dt: DataType = DataType.u8
    dst_dt: DataType = DataType.u8
    zp_src: int = 0
    zp_dst: int = 0
    post_ops: tuple[str, ...] = ("relu", "sum", "binary_mul")
    deconv: bool = False
    n: int = 2
    limit: int | None = None


CONV_CASES = [
    ConvCase("3x3_u8_zp", zp_src=118, zp_dst=9),
    ConvCase("1x1_amx_path", c=32, kernel=(1, 1), padding_l=(0, 0), padding_r=(0, 0),
             zp_src=128, zp_dst=3),
    ConvCase("1x1_stride2", c=32, kernel=(1, 1), strides=(2, 2), padding_l=(0, 0),
             padding_r=(0, 0), zp_src=7, post_ops=("linear", "sum")),
    ConvCase("grouped_stride_dilation_asym_pad", c=16, o=32, groups=4, strides=(2, 2),
             dilation=(1, 1), padding_l=(1, 0), padding_r=(2, 1), spatial=(11, 10),
             zp_src=50, zp_dst=128, post_ops=("clip", "sum", "binary_add")),
    ConvCase("depthwise", c=32, o=32, groups=32, zp_src=100, dst_dt=DataType.s8, zp_dst=-5,
             post_ops=("leaky_relu", "binary_mul", "sum")),
    ConvCase("s8_src_s8_dst", src_dt=DataType.s8, dst_dt=DataType.s8, zp_dst=4,
             post_ops=("relu", "sum", "prelu")),
    ConvCase("larger_3x3", c=64, o=64, spatial=(14, 14), zp_src=128, n=1),
    ConvCase("deconv_stride2_asym", c=16, o=16, spatial=(5, 5), strides=(2, 2),
             padding_l=(1, 1), padding_r=(0, 0), zp_src=60, zp_dst=7, deconv=True),
    ConvCase("deconv_grouped", c=16, o=32, groups=2, spatial=(6, 6), strides=(2, 2),
             padding_l=(1, 1), padding_r=(1, 1), kernel=(4, 4), zp_src=11, deconv=True,
             post_ops=("relu", "sum")),
]


def build_post_ops(names: tuple[str, ...], dst_shape: tuple[int, ...], channel_axis: int,
                   rng: np.random.Generator, dst_dt: DataType
                   ) -> tuple[PostOps, dict[int, Memory], dict[int, np.ndarray]]:
    """A chain from short names, its execute args, and the reference's post-op arrays."""
    post_ops = PostOps()
    args: dict[int, Memory] = {}
    arrays: dict[int, np.ndarray] = {}
    channels = dst_shape[channel_axis]
    per_channel = [1] * len(dst_shape)
    per_channel[channel_axis] = channels
    sum_zp = 5 if dst_dt == DataType.u8 else -3
    for index, name in enumerate(names):
        if name == "relu":
            post_ops.append_eltwise(Alg.eltwise_relu)
        elif name == "leaky_relu":
            post_ops.append_eltwise(Alg.eltwise_relu, 0.125)
        elif name == "linear":
            post_ops.append_eltwise(Alg.eltwise_linear, 0.7, -0.3)
        elif name == "clip":
            post_ops.append_eltwise(Alg.eltwise_clip, -2.0, 6.0)
        elif name == "sum":
            post_ops.append_sum(0.75, sum_zp)
        elif name == "sum_no_zp":
            post_ops.append_sum(0.75, 0)
        elif name.startswith("binary_"):
            values = rng.uniform(0.5, 1.5, channels).astype(F32).reshape(per_channel)
            md = MemoryDesc.from_tag(tuple(per_channel), DataType.f32)
            post_ops.append_binary(Alg[name], md)
            args[Arg.post_op(index, Arg.SRC_1)] = Memory.from_array(values)
            arrays[index] = values
        elif name == "prelu":
            post_ops.append_prelu(1 << channel_axis)
            slopes = rng.uniform(0.05, 0.3, channels).astype(F32)
            args[Arg.post_op(index, Arg.WEIGHTS)] = Memory.from_array(slopes)
            arrays[index] = slopes.reshape(per_channel)
        else:
            raise AssertionError(name)
    return post_ops, args, arrays


@dataclass(frozen=True)
class Outcome:
    got: np.ndarray
    expected: np.ndarray  # the selected ISA's model
    exact: np.ndarray  # the exact-accumulator model (equal to expected on VNNI/AMX)
    impl: str


def run_conv(case: ConvCase, seed: int = 0) -> Outcome:
    """Run one case through oneDNN and through the reference."""
    rng = np.random.default_rng(seed)
    g, k = case.groups, case.kernel
    src = rand_int(rng, case.src_dt, (case.n, case.c, *case.spatial), case.limit)
    if g > 1:
        w_shape = (g, case.o // g, case.c // g, *k)
    else:
        w_shape = (case.o, case.c, *k)
    w = rand_int(rng, DataType.s8, w_shape)
    geometry = {"strides": case.strides, "dilation": case.dilation,
                "padding_l": case.padding_l, "padding_r": case.padding_r}
    exact_acc = (ref.deconv_acc if case.deconv else ref.conv_acc)(src, w, zp_src=case.zp_src,
                                                                  **geometry)
    dst_shape = exact_acc.shape
    s_src, s_dst = F32(0.021), F32(0.173)
    s_wei = rng.uniform(0.002, 0.01, case.o).astype(F32)
    bias = rng.normal(0, 1.5, case.o).astype(F32)
    prev = rand_int(rng, case.dst_dt, dst_shape)
    post_ops, po_args, po_arrays = build_post_ops(case.post_ops, dst_shape, 1, rng, case.dst_dt)
    attr = (PrimitiveAttr().set_scales_mask(Arg.SRC, 0)
            .set_scales_mask(Arg.WEIGHTS, 3 if g > 1 else 1).set_scales_mask(Arg.DST, 0)
            .set_post_ops(post_ops))
    if case.zp_src:
        attr.set_zero_points_mask(Arg.SRC, 0)
    if case.zp_dst:
        attr.set_zero_points_mask(Arg.DST, 0)
    src_md = MemoryDesc.from_tag(src.shape, case.src_dt, FormatTag.nhwc)
    dst_md = MemoryDesc.from_tag(dst_shape, case.dst_dt, FormatTag.nhwc)
    make = deconvolution if case.deconv else convolution
    pd = make(src_md, MemoryDesc.from_tag(w.shape, DataType.s8, FormatTag.any), dst_md,
              bias=MemoryDesc.from_tag((case.o,), DataType.f32), attr=attr, **geometry)
    # the accumulator follows the implementation oneDNN picked, not the CPU: a VNNI CPU runs
    # some shapes on an avx2 kernel (deconv_grouped on a Xeon with AVX-512 VNNI, no AMX)
    acc = conv_acc_model(src, w, case.zp_src, case.deconv, impl_is_exact(pd.impl_name),
                         **geometry)
    primitive = pd.create()
    dst = filled(dst_md, prev)
    args = {Arg.SRC: filled(src_md, src), Arg.WEIGHTS: filled(pd.weights_md, w),
            Arg.BIAS: Memory.from_array(bias), Arg.DST: dst,
            Arg.scales(Arg.SRC): Memory.scales(s_src), Arg.scales(Arg.DST): Memory.scales(s_dst),
            Arg.scales(Arg.WEIGHTS): Memory.scales(s_wei), **po_args}
    if case.zp_src:
        args[Arg.zero_points(Arg.SRC)] = Memory.zero_points(case.zp_src)
    if case.zp_dst:
        args[Arg.zero_points(Arg.DST)] = Memory.zero_points(case.zp_dst)
    primitive.execute(primitive.with_scratchpad(args))

    def model(a: np.ndarray) -> np.ndarray:
        return ref.epilogue(a, NP[case.dst_dt], src_scale=s_src, wei_scales=s_wei, bias=bias,
                            post_ops=post_ops.records, post_op_args=po_arrays, dst_prev=prev,
                            dst_scale=s_dst, dst_zp=case.zp_dst)

    return Outcome(dst.read(), model(acc), model(exact_acc), pd.impl_name)


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: c.name)
def test_conv_bit_exact(case: ConvCase) -> None:
    out = run_conv(case)
    if not impl_is_exact(out.impl) and not out.impl.startswith("ref"):
        # a CPU still runs some shapes on an older ISA's kernel (measured: deconv_grouped and
        # deconv_stride2_asym on jit_uni_int8:avx2 under AVX512_CORE_VNNI and AVX512_CORE);
        # the compiler splits those per primitive (compiler/lower/no_vnni.py), this checks
        # that they saturate as modelled
        assert out.impl.rsplit(":", 1)[-1] in {isa.name for isa in SATURATING_ISAS}, out.impl
    else:
        assert any(mark in out.impl for mark in IMPL_MARKS), out.impl
    max_lsb, identical = step_diff(out.got, out.expected)
    assert max_lsb == 0, f"{case.name} on {out.impl}: max {max_lsb} LSB, {identical:.4%} same"
    if impl_is_exact(out.impl):
        assert np.array_equal(out.expected, out.exact)


def test_isa_is_the_requested_one() -> None:
    if REQUESTED_ISA is None:
        pytest.skip("no ISA requested (QFUSE_ONEDNN_ISA unset)")
    assert ISA.name == REQUESTED_ISA


def test_conv_rounding_ties() -> None:
    """1x1 conv whose outputs sit within a few ulps of x.5 after the dst scale: only the exact
    f32 model of reference.py gets all of them; the ONNX-style form `rint(x/s) + zp` and an
    FMA for scale+bias each get some wrong. Channel o targets pixel o % 64; acc = 64*hi + lo."""
    rng = np.random.default_rng(7)
    c, o, h, w_ = 32, 256, 8, 8
    pixels = h * w_
    hi, lo = rng.integers(0, 256, pixels), rng.integers(0, 256, pixels)
    acc = (64 * hi + lo).astype(np.int64)
    src = np.zeros((1, c, h, w_), np.uint8)
    src[0, 0], src[0, 1] = hi.reshape(h, w_), lo.reshape(h, w_)
    w = np.zeros((o, c, 1, 1), np.int8)
    w[:, 0], w[:, 1] = 64, 1
    s_src, s_dst, zp_dst = F32(1.37), F32(0.29), 120
    s_wei = rng.uniform(1e-3, 1e-2, o).astype(F32)
    comb = (s_src * s_wei).astype(F32)
    target = (rng.integers(-20, 20, o) + 0.5) * float(s_dst)
    bias = (target - acc[np.arange(o) % pixels] * comb).astype(F32)
    bias = (bias + rng.integers(-3, 4, o) * np.spacing(np.abs(bias))).astype(F32)
    src_md = MemoryDesc.from_tag(src.shape, DataType.u8, FormatTag.nhwc)
    dst_md = MemoryDesc.from_tag((1, o, h, w_), DataType.u8, FormatTag.nhwc)
    attr = (PrimitiveAttr().set_scales_mask(Arg.SRC, 0).set_scales_mask(Arg.WEIGHTS, 1)
            .set_scales_mask(Arg.DST, 0).set_zero_points_mask(Arg.DST, 0))
    pd = convolution(src_md, MemoryDesc.from_tag(w.shape, DataType.s8, FormatTag.any), dst_md,
                     bias=MemoryDesc.from_tag((o,), DataType.f32), attr=attr)
    conv = pd.create()
    dst = Memory(dst_md)
    conv.execute(conv.with_scratchpad({
        Arg.SRC: filled(src_md, src), Arg.WEIGHTS: filled(pd.weights_md, w),
        Arg.BIAS: Memory.from_array(bias), Arg.DST: dst,
        Arg.scales(Arg.SRC): Memory.scales(s_src), Arg.scales(Arg.WEIGHTS): Memory.scales(s_wei),
        Arg.scales(Arg.DST): Memory.scales(s_dst),
        Arg.zero_points(Arg.DST): Memory.zero_points(zp_dst)}))
    got = dst.read()[0].reshape(o, pixels)
    full = acc[None, :].astype(F32)
    model = ref.epilogue(full, np.uint8, channel_axis=0, src_scale=s_src, wei_scales=s_wei,
                         bias=bias, dst_scale=s_dst, dst_zp=zp_dst)
    assert step_diff(got, model)[0] == 0
    x = (full * comb[:, None]).astype(F32) + bias[:, None]
    y = (x * (F32(1) / s_dst)).astype(F32)
    notes_form = np.clip(np.rint(y) + zp_dst, 0, 255)
    fma_form = np.clip(np.rint(ref.fma32(full, comb[:, None], bias[:, None]) * (F32(1) / s_dst)
                               + F32(zp_dst)), 0, 255)
    assert np.count_nonzero(notes_form != got) > 0  # 21 of the 256 targets here
    assert np.count_nonzero(fma_form != got) > 0  # 7 of 256


@pytest.mark.skipif(EXACT_DOT_PRODUCTS, reason="int16 saturation exists only without VNNI/AMX")
def test_avx2_differs_from_exact_sum() -> None:
    """Under AVX2 the kernels' results (equal to the AVX2 model, checked above) differ from
    the exact accumulator when u8 src uses the full range and always for s8 src; with
    u8 src <= 127 no channel pair can leave int16 and the exact sum comes out."""
    full = run_conv(ConvCase("u8_full", post_ops=()))
    small = run_conv(ConvCase("u8_small", post_ops=(), limit=127))
    s8_small = run_conv(ConvCase("s8_small", post_ops=(), src_dt=DataType.s8, limit=20))
    assert step_diff(full.got, full.exact)[0] > 0
    assert step_diff(small.got, small.exact)[0] == 0
    assert step_diff(s8_small.got, s8_small.exact)[0] > 0


@dataclass(frozen=True)
class GemmCase:
    name: str
    src_shape: tuple[int, ...]
    wei_shape: tuple[int, ...]
    matmul: bool = True
    src_dt: DataType = DataType.u8
    dst_dt: DataType = DataType.u8
    zp_src: int = 0
    zp_wei: int = 0
    zp_dst: int = 0
    post_ops: tuple[str, ...] = ("relu", "sum", "binary_mul")
    native_ref: str = ""  # why oneDNN 3.2 falls back to ref:any on VNNI/AMX, if it does


GEMM_CASES = [
    GemmCase("ip_2d", (4, 64), (48, 64), matmul=False,
             post_ops=("relu", "sum_no_zp", "binary_mul")),
    GemmCase("ip_2d_sum_zp", (4, 64), (48, 64), matmul=False,
             native_ref="brgemm inner product refuses a sum post-op with a zero point"),
    GemmCase("ip_4d_src", (2, 16, 3, 3), (32, 16, 3, 3), matmul=False,
             post_ops=("leaky_relu", "binary_add", "sum_no_zp"),
             native_ref="4-D src goes to gemm_s8u8s32, which needs sum as the first post-op"),
    GemmCase("ip_4d_src_sum_first", (2, 16, 3, 3), (32, 16, 3, 3), matmul=False,
             post_ops=("sum_no_zp", "leaky_relu", "binary_add")),
    GemmCase("ip_s8_src_s8_dst", (4, 64), (32, 64), matmul=False, src_dt=DataType.s8,
             dst_dt=DataType.s8, post_ops=("clip", "sum_no_zp")),
    GemmCase("ip_large", (64, 256), (128, 256), matmul=False,
             post_ops=("relu", "sum_no_zp", "binary_mul")),
    GemmCase("matmul_2d_zero_points", (8, 64), (64, 48), zp_src=121, zp_wei=3, zp_dst=10),
    GemmCase("matmul_2d_src_dst_zp", (8, 64), (64, 48), zp_src=121, zp_dst=10),
    GemmCase("matmul_large", (64, 256), (256, 128), zp_src=128, zp_dst=10),
    GemmCase("matmul_batched_broadcast", (3, 8, 32), (1, 32, 16), zp_src=17, zp_dst=2,
             post_ops=("linear", "binary_mul")),
    GemmCase("matmul_s8_src", (8, 64), (64, 32), src_dt=DataType.s8, dst_dt=DataType.s8,
             zp_src=-4, zp_dst=-1, post_ops=("relu", "sum", "prelu")),
]


def gemm_acc_model(case: GemmCase, src: np.ndarray, w: np.ndarray, impl: str) -> np.ndarray:
    """Exact, or on AVX2 GEMM kernels (gemm:jit, gemm_s8u8s32) the int16-saturated pairs of
    consecutive K products on src made unsigned (s8 src + 128, corrected exactly after)."""
    if case.matmul:
        a, b = src.astype(np.int64), w.astype(np.int64)
    else:
        a = src.reshape(src.shape[0], -1).astype(np.int64)
        b = w.reshape(w.shape[0], -1).astype(np.int64).T
    exact = np.matmul(a - case.zp_src, b - case.zp_wei)
    if impl.startswith("ref") or impl_is_exact(impl):
        return exact
    shift = case.zp_src + (128 if src.dtype == np.int8 else 0)
    products = (a + (shift - case.zp_src))[..., :, :, None] * b[..., None, :, :]
    pairs = products[..., 0::2, :] + products[..., 1::2, :]
    acc = np.clip(pairs, -32768, 32767).sum(axis=-2) - shift * b.sum(axis=-2)[..., None, :]
    # weight zero points: an exact compensation zp_w·Σ(a - zp_src) after the saturated sum
    # (measured on brg:avx512_core, AVX-512 without VNNI)
    return acc - case.zp_wei * (a - case.zp_src).sum(axis=-1)[..., None]


def run_gemm(case: GemmCase, seed: int = 0) -> Outcome:
    rng = np.random.default_rng(seed)
    src = rand_int(rng, case.src_dt, case.src_shape)
    w = rand_int(rng, DataType.s8, case.wei_shape)
    exact = gemm_acc_model(case, src, w, "ref")
    channels = exact.shape[-1]
    channel_axis = exact.ndim - 1
    s_src, s_dst = F32(0.013), F32(0.21)
    s_wei = rng.uniform(0.002, 0.01, channels).astype(F32)
    bias = rng.normal(0, 1.5, channels).astype(F32)
    prev = rand_int(rng, case.dst_dt, exact.shape)
    post_ops, po_args, po_arrays = build_post_ops(case.post_ops, exact.shape, channel_axis, rng,
                                                  case.dst_dt)
    wei_mask = 1 << (len(case.wei_shape) - 1) if case.matmul else 1
    attr = (PrimitiveAttr().set_scales_mask(Arg.SRC, 0).set_scales_mask(Arg.WEIGHTS, wei_mask)
            .set_scales_mask(Arg.DST, 0).set_post_ops(post_ops))
    zero_points = {Arg.SRC: case.zp_src, Arg.WEIGHTS: case.zp_wei, Arg.DST: case.zp_dst}
    for arg, zp in zero_points.items():
        if zp:
            attr.set_zero_points_mask(arg, 0)
    src_md = MemoryDesc.from_tag(src.shape, case.src_dt)
    dst_md = MemoryDesc.from_tag(exact.shape, case.dst_dt)
    bias_shape = (1,) * (exact.ndim - 1) + (channels,) if case.matmul else (channels,)
    bias_md = MemoryDesc.from_tag(bias_shape, DataType.f32)
    wei_any = MemoryDesc.from_tag(w.shape, DataType.s8, FormatTag.any)
    if case.matmul:
        pd = matmul(src_md, wei_any, dst_md, bias=bias_md, attr=attr)
    else:
        pd = inner_product(src_md, wei_any, dst_md, bias=bias_md, attr=attr)
    primitive = pd.create()
    dst = filled(dst_md, prev)
    args = {Arg.SRC: filled(src_md, src), Arg.WEIGHTS: filled(pd.weights_md, w),
            Arg.BIAS: filled(bias_md, bias.reshape(bias_shape)), Arg.DST: dst,
            Arg.scales(Arg.SRC): Memory.scales(s_src), Arg.scales(Arg.DST): Memory.scales(s_dst),
            Arg.scales(Arg.WEIGHTS): Memory.scales(s_wei), **po_args}
    for arg, zp in zero_points.items():
        if zp:
            args[Arg.zero_points(arg)] = Memory.zero_points(zp)
    primitive.execute(primitive.with_scratchpad(args))

    def model(acc: np.ndarray) -> np.ndarray:
        return ref.epilogue(acc, NP[case.dst_dt], channel_axis=channel_axis, src_scale=s_src,
                            wei_scales=s_wei, bias=bias, post_ops=post_ops.records,
                            post_op_args=po_arrays, dst_prev=prev, dst_scale=s_dst,
                            dst_zp=case.zp_dst)

    acc = gemm_acc_model(case, src, w, pd.impl_name)
    return Outcome(dst.read(), model(acc), model(exact), pd.impl_name)


@pytest.mark.parametrize("case", GEMM_CASES, ids=lambda c: c.name)
def test_gemm_bit_exact(case: GemmCase) -> None:
    out = run_gemm(case)
    if EXACT_DOT_PRODUCTS:
        assert out.impl.startswith("ref") == bool(case.native_ref), out.impl
        assert np.array_equal(out.expected, out.exact)
    max_lsb, identical = step_diff(out.got, out.expected)
    assert max_lsb == 0, f"{case.name} on {out.impl}: max {max_lsb} LSB, {identical:.4%} same"


def test_binding_demo(capsys: pytest.CaptureFixture[str]) -> None:
    """examples/binding_demo.py compares with the exact model: 0 LSB with VNNI/AMX; without
    them it reports the int16 saturation modelled above and exits 1."""
    from qfuse.examples import binding_demo

    status = binding_demo.main()
    out = capsys.readouterr().out
    if EXACT_DOT_PRODUCTS:
        assert status == 0 and "max difference 0 LSB, 100.00% identical" in out
    else:
        assert status == 1 and "saturate in int16" in out
