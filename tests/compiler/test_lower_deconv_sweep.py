"""int8 ConvTranspose, bit-exact over a sweep of small shapes, on whatever oneDNN picks here.

240 configurations: (stride, output_padding) in {(1, 0), (2, 0), (2, 1), (3, 1), (3, 2)}, kernel
2..4, input 2x3 / 4x5 / 5x5 / 6x4, groups 1 and 2, pads 0 and 1; u8 src with a zero point,
full-range s8 weights, the fused chain (per-channel scale, bias, ReLU, u8 dst). Each compiled
plan is held to 0 LSB against oneDNN's model on the exact accumulator (``exact_expected``) and
1 LSB against the chain's meaning (the composer's float re-association; measured: 0).

Why: oneDNN 3.2's int8 jit deconvolutions compute outputs that no kernel tap reaches wrong.
The AVX-512 kernel drops taps next to output_padding when the output row fits one register
block (lower_compute.WRONG_WITH_NEGATIVE_PADDING_R: 88-182 LSB on a Xeon with AVX-512 VNNI, 32
of 240 shapes; that implementation is refused for padding_r < 0); the jit_uni kernel (AVX2,
SSE4.1) writes 212-255 LSB off values into trailing rows / columns when output_padding exceeds
the end pad by 2, or by 1 with stride 3, and between taps when kernel < stride (measured here,
36 of these 240 shapes). ``cover_every_output`` appends zero taps so that every output is
reached (padding_r >= 0, kernel >= stride): same sums, jit speed. ``_taps`` transcribes the two
kernels' tap selection for one block (v3.2's ``get_ow_start`` / ``get_ow_end`` with the
overflow each passes) so the refusal condition is checked on every machine.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from qfuse.compiler.lower import Options
from qfuse.compiler.lower.lower_compute import cover_every_output, wrong_for
from qfuse.ir import DType, Graph
from qfuse.runtime.executor import Executor
from qfuse.runtime.numerics import step_diff
from tests.compiler.lower_helpers import (
    add_int8_conv,
    exact_expected,
    int_input,
    lower_built,
    random_int,
    ref_eval,
)

STRIDES = [(1, 0), (2, 0), (2, 1), (3, 1), (3, 2)]  # (stride, output_padding)
KERNELS = [2, 3, 4]
SIZES = [(2, 3), (4, 5), (5, 5), (6, 4)]
GROUPS = [1, 2]
PADS = [0, 1]
CONFIGS = list(itertools.product(STRIDES, KERNELS, SIZES, GROUPS, PADS))


def _deconv(stride: int, out_pad: int, kernel: int, size: tuple[int, int], group: int,
            pad: int, seed: int) -> tuple[Graph, dict[str, np.ndarray]]:
    g = Graph("deconv")
    c = 16 * group  # 16 channels per group: one AVX-512 block, the widest register rows
    x = int_input(g, "x", (1, c, *size), DType.U8, 0.03, 7)
    node = add_int8_conv(g, x, 16 * group, kernel=kernel, stride=stride, pads=(pad,) * 4,
                         group=group, deconv=True, output_padding=out_pad, seed=seed)
    g.outputs.append(node.outputs[0])
    return g, {"x": random_int(np.random.default_rng(seed + 1), (1, c, *size), DType.U8)}


def test_sweep_has_240_configurations() -> None:
    assert len(CONFIGS) == 240


@pytest.mark.parametrize("stride_op", STRIDES, ids=[f"s{s}op{o}" for s, o in STRIDES])
def test_deconvolutions_are_bit_exact(stride_op: tuple[int, int]) -> None:
    stride, out_pad = stride_op
    worst_model = worst_chain = 0
    impls: set[str] = set()
    for seed, (_, kernel, size, group, pad) in enumerate(
            c for c in CONFIGS if c[0] == stride_op):
        graph, feeds = _deconv(stride, out_pad, kernel, size, group, pad, seed)
        plan = lower_built(graph, Options())
        out = Executor(plan).run(feeds)[graph.outputs[0]]
        node = graph.producer(graph.outputs[0])
        assert node is not None
        model = exact_expected(graph, node, [feeds["x"], graph.constant(node.inputs[1])])
        chain = ref_eval(graph, feeds)[graph.outputs[0]]
        where = f"stride {stride}, output_padding {out_pad}, kernel {kernel}, {size}, " \
                f"groups {group}, pads {pad}"
        model_lsb = step_diff(out, model).max_steps
        chain_lsb = step_diff(out, chain).max_steps
        assert model_lsb == 0, (where, model_lsb, [k.impl for k in plan.kernels])
        assert chain_lsb <= 1, (where, chain_lsb)
        worst_model, worst_chain = max(worst_model, model_lsb), max(worst_chain, chain_lsb)
        impls |= {k.impl for k in plan.kernels if k.kind == "deconvolution"}
    print(f"\nstride {stride} output_padding {out_pad}: 48 shapes, max {worst_model} LSB vs "
          f"model, {worst_chain} vs chain, on {sorted(impls)}")


# ------------------------------------------------------------------ the cause, transcribed
def _taps(iw: int, kw: int, stride: int, l_pad: int, r_pad: int, avx512: bool
          ) -> tuple[set[tuple[int, int]], set[tuple[int, int]]]:
    """(taps the kernel computes, taps there are) as (output column, kernel column) for a row
    that is one register block (ur_w == ow), no dilation. The overflow passed to get_ow_end:
    jit_uni (every ISA below AVX-512) ``max(0, (kw - 1 - max(0, r_pad)) / s)``; the AVX-512
    kernel's ``get_ur_w_blks_params`` ``max(0, (ow - 1 + l_pad) / s - (iw - 1))``."""
    ow = (iw - 1) * stride + kw - l_pad - r_pad
    truth = {(j, k) for j in range(ow) for k in range(kw)
             if (j + l_pad - k) % stride == 0 and 0 <= (j + l_pad - k) // stride < iw}
    l_overflow = max(0, (kw - 1 - l_pad) // stride)
    if avx512:
        r_overflow = max(0, (ow - 1 + l_pad) // stride - (iw - 1))
    else:
        r_overflow = max(0, (kw - 1 - max(0, r_pad)) // stride)
    got = set()
    for k in range(kw):
        start = (ow - 1 + r_pad) % stride + l_overflow * stride - (kw - 1 - k)  # get_ow_start
        while start < 0:
            start += stride
        width = ow + min(0, r_pad)  # get_ow_end: ur_w == ow drops the negative padding
        res = (width - 1 + l_pad) % stride + r_overflow * stride - k
        while res < 0:
            res += stride
        got |= {(j, k) for j in range(start, width - res) if (j + l_pad - k) % stride == 0}
    return got, truth


def test_avx512_overflow_skips_taps_only_where_refused() -> None:
    """Over the sweep's widths (and 1..6 more): the uni kernel's taps are always right; the
    AVX-512 kernel's are wrong in exactly some shapes with padding_r < 0 (output_padding >
    pad), all of which the lowering refuses, and right wherever padding_r >= 0."""
    wrong = 0
    for (stride, out_pad), kernel, pad, iw in itertools.product(STRIDES, KERNELS, PADS,
                                                                range(1, 7)):
        r_pad = pad - out_pad
        if (iw - 1) * stride + kernel - pad - r_pad <= 0:
            continue
        got, truth = _taps(iw, kernel, stride, pad, r_pad, avx512=False)
        assert got == truth, (stride, out_pad, kernel, pad, iw)
        got, truth = _taps(iw, kernel, stride, pad, r_pad, avx512=True)
        geometry = {"padding_r": (r_pad, r_pad)}
        if got != truth:
            wrong += 1
            assert truth - got and not got - truth  # taps dropped, none invented
            assert wrong_for("jit_deconvolution:avx512_core_vnni", "deconvolution", geometry)
        if r_pad >= 0:
            assert got == truth
            assert wrong_for("jit_deconvolution:avx512_core_vnni", "deconvolution",
                             geometry) is None
    assert wrong > 0


def test_refusal_names_only_the_avx512_kernel() -> None:
    negative = {"padding_r": (0, -1)}
    for impl in ("jit_deconvolution:avx512_core", "jit_deconvolution:avx512_core_vnni"):
        assert wrong_for(impl, "deconvolution", negative)
        assert wrong_for(impl, "deconvolution", {"padding_r": (0, 0)}) is None
        assert wrong_for(impl, "convolution", negative) is None
    for impl in ("jit_deconvolution:avx512_core_amx", "jit_uni_int8:avx2",
                 "brg_conv:avx512_core_amx+brgconv_strided:avx512_core_amx", "ref:any"):
        assert wrong_for(impl, "deconvolution", negative) is None


@pytest.mark.parametrize("stride, out_pad, kernel, pad", [
    (4, 0, 1, 0),  # rows and columns between taps
    (3, 2, 3, 0),  # two trailing rows and columns no tap reaches
    (3, 2, 3, 1),  # padding_r = -1 with stride 3
    (4, 3, 3, 1),
])
def test_outputs_no_tap_reaches(stride: int, out_pad: int, kernel: int, pad: int) -> None:
    """Shapes where oneDNN 3.2's jit_uni_int8 deconvolution was measured 212-255 LSB off (AVX2)
    before lower_compute.cover_every_output: bit-exact."""
    graph, feeds = _deconv(stride, out_pad, kernel, (3, 4), 1, pad, seed=3)
    plan = lower_built(graph, Options())
    out = Executor(plan).run(feeds)[graph.outputs[0]]
    node = graph.producer(graph.outputs[0])
    assert node is not None
    model = exact_expected(graph, node, [feeds["x"], graph.constant(node.inputs[1])])
    assert step_diff(out, model).max_steps == 0  # on jit_uni_int8 under AVX2 (SSE4.1: ref for some)


def test_cover_every_output_keeps_the_output_size() -> None:
    w = np.arange(2 * 3 * 2 * 2, dtype=np.int8).reshape(2, 3, 2, 2)
    geometry = {"strides": (2, 4), "padding_l": (0, 0), "padding_r": (-1, 0),
                "dilation": (0, 0)}
    wide, geo = cover_every_output(w, geometry)
    assert wide.shape == (2, 3, 3, 4) and list(geo["padding_r"]) == [0, 2]
    np.testing.assert_array_equal(wide[:, :, :2, :2], w)
    assert not wide[:, :, 2:, :].any() and not wide[:, :, :, 2:].any()
    for i, (k, kk) in enumerate(((2, 3), (2, 4))):  # (i - 1)·s + k - pad_l - pad_r
        before = 5 * geometry["strides"][i] + k - geometry["padding_r"][i]
        assert before == 5 * geo["strides"][i] + kk - geo["padding_r"][i]
    dilated = {**geometry, "strides": (1, 1), "padding_r": (-3, 1), "dilation": (1, 0)}
    wide, geo = cover_every_output(w, dilated)  # ceil(3 / 2) = 2 taps of dilation 2
    assert wide.shape == (2, 3, 4, 2) and list(geo["padding_r"]) == [1, 1]
    assert cover_every_output(w, {**geometry, "padding_r": (0, 0), "strides": (2, 2)})[0] is w
