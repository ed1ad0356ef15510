"""Exact int8 without VNNI/AMX: the weight split of compiler/lower/no_vnni.py.

oneDNN fixes its ISA once per process, so ``test_under_avx2`` runs this module (and the int8
checks of test_lower_zoo.py) in a subprocess with ONEDNN_MAX_CPU_ISA=AVX2; on a CPU without
VNNI the ``no_vnni`` tests also run in-process, on a VNNI/AMX CPU they skip in-process. The
subprocess also dumps every value the zoo plans compute, and the parent checks them against its
own ISA's: with the split, AVX2 and AMX give the same integers, bit for bit.

Tolerances: the split primitive is checked to 0 LSB against oneDNN's model on the exact
accumulator (lower_helpers.exact_expected = apply_composed), which no_vnni.py's docstring
derives (same float32 roundings as the single primitive) for |acc_hi| ≤ 2^24 (K ≤ 1028 for any
data); beyond that, ≤ 1 LSB on near-ties (``test_accumulators_beyond_2_24``). Against the
chain's meaning: ≤ 1 LSB on ≥ 99.9 %, as on VNNI/AMX (the composer's float re-association).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from qfuse.compiler.api import compile_model
from qfuse.compiler.errors import UnsupportedModelError
from qfuse.compiler.lower import Options, lower_matmul
from qfuse.compiler.lower.no_vnni import (
    EXCESS,
    LOW_HALF,
    PAIR_LIMIT,
    PAIRED,
    PAIRED_IMPLS,
    SPLIT,
    impl_is_exact,
    nested_pair_split,
    pair_split,
    split_weights,
    split_zero_point,
)
from qfuse.examples import zoo
from qfuse.ir import DType, Graph
from qfuse.ir.chain import Fused, Scale, Shift
from qfuse.runtime.executor import Executor
from qfuse.runtime.numerics import step_diff
from qfuse.runtime.onednn import CpuIsa, effective_cpu_isa
from qfuse.runtime.reference.fused import accumulate
from tests.compiler.lower_helpers import (
    MATMUL_CASES,
    SPLITS_INT8,
    add_int8_conv,
    exact_expected,
    int_input,
    lower_built,
    matmul_graph,
    quantize_item,
    random_int,
    ref_eval,
    run_plan,
    zoo_values,
)

ROOT = Path(__file__).resolve().parents[2]
U8, S8 = DType.U8, DType.S8
no_vnni = pytest.mark.skipif(not SPLITS_INT8, reason="needs a CPU without VNNI (see "
                             "test_under_avx2) and Options.exact_int8 on")


# ------------------------------------------------------------------ everywhere
def test_split_halves_are_small_and_exact() -> None:
    w = np.arange(-128, 128, dtype=np.int16).astype(np.int8)
    hi, lo = split_weights(w)
    assert np.array_equal(2 * hi.astype(np.int16) + lo, w)
    assert np.abs(hi.astype(np.int16)).max() == 64 and set(np.unique(lo)) == {-1, 0, 1}
    # no u8·s8 pair of either half can leave int16: 255·64·2 = 32640
    assert 2 * 255 * np.abs(hi.astype(np.int32)).max() <= 32767
    for zp in (-128, -5, 0, 1, 127, 255):
        zh, zl = split_zero_point(zp)
        assert 2 * zh + zl == zp and zl in (0, 1)


def _tailed(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Weights as trained layers have them: most small, a few in the tails up to ±127."""
    rng = np.random.default_rng(seed)
    return np.clip(np.rint(rng.standard_normal(shape) * 30), -128, 127).astype(np.int8)


def _pairs_within_int16(w: np.ndarray) -> bool:
    a, b = w[:, 0:w.shape[1] - 1:2].astype(np.int32), w[:, 1::2].astype(np.int32)
    return bool((np.maximum(a, 0) + np.maximum(b, 0) <= PAIR_LIMIT).all()
                and (np.minimum(a, 0) + np.minimum(b, 0) >= -PAIR_LIMIT).all())


@pytest.mark.parametrize("channels", [64, 37])
def test_pair_split_keeps_every_pair_within_int16(channels: int) -> None:
    w = _tailed((32, channels, 3, 3), 3)
    assert not _pairs_within_int16(w)
    split = pair_split(w)
    assert split is not None and split[1] is not None
    m, e = split
    assert e.shape == (32, channels // 2, 3, 3)  # an odd count's last channel pairs with none
    whole = m.astype(np.int16)
    whole[:, 0:2 * (channels // 2):2] += e
    assert np.array_equal(whole, w)
    assert _pairs_within_int16(m) and _pairs_within_int16(e)
    assert np.count_nonzero(e) < 0.02 * w.size  # the tails: few pairs need an excess


def test_pair_split_declines_or_needs_none() -> None:
    rng = np.random.default_rng(4)
    uniform = rng.integers(-128, 128, (32, 64, 3, 3)).astype(np.int8)
    assert pair_split(uniform) is None  # the excess itself would saturate: the halves stay
    alternating = np.tile(np.array([100, -100, -100, 100], np.int8), (8, 16, 1, 1))
    split = pair_split(alternating.reshape(8, 64, 1, 1))
    assert split is not None and split[1] is None  # no pair to fix: nothing is split


@pytest.mark.parametrize("channels", [64, 38])
def test_nested_pair_split_where_the_excess_itself_saturates(channels: int) -> None:
    """Uniform weights (a random-weight layer): the excess's own pairs leave int16, so
    pair_split declines; split once more, every part's pairs stay within int16 and the parts
    add up to the weights (e1 on channels 2k, e2 on channels 4j)."""
    w = np.random.default_rng(6).integers(-128, 128, (32, channels, 3, 3)).astype(np.int8)
    assert pair_split(w) is None
    nested = nested_pair_split(w)
    assert nested is not None
    m, e1, e2 = nested
    assert e1.shape == (32, channels // 2, 3, 3) and e2.shape == (32, channels // 4, 3, 3)
    whole = m.astype(np.int16)
    whole[:, 0:2 * (channels // 2):2] += e1
    whole[:, 0:4 * (channels // 4):4] += e2
    assert np.array_equal(whole, w)
    assert _pairs_within_int16(m) and _pairs_within_int16(e1) and _pairs_within_int16(e2)
    assert np.count_nonzero(e2) and nested_pair_split(_tailed((32, 64, 3, 3), 3)) is None


# oneDNN 3.2 implementation names (JIT_IMPL_NAME_HELPER, src/cpu/x64/cpu_isa_traits.hpp, and
# the composites of ref_deconvolution.hpp / jit_brgemm_deconv.hpp) → exact on a CPU whose
# effective ISA is avx2 / avx512_core_vnni (the int8 GEMM kernels follow the CPU).
IMPL_TABLE = [
    ("jit_uni_int8:avx2", False, False),  # vpmaddubsw: u8·s8 pairs saturate in int16
    ("jit_uni_int8_1x1:avx2", False, False),
    ("jit_uni_int8:sse41", False, False),
    ("jit_uni_int8_1x1:sse41", False, False),
    ("jit_int8:avx512_core", False, False),  # AVX-512 without VNNI (Skylake)
    ("jit_int8_1x1:avx512_core", False, False),
    ("jit_deconvolution:avx512_core", False, False),
    ("brgconv:avx512_core", False, False),
    ("jit_uni_int8:avx2_vnni", True, True),  # AVX-VNNI (vpdpbusd, VEX)
    ("jit_uni_int8:avx2_vnni_2", True, True),
    ("jit_int8:avx512_core_vnni", True, True),
    ("jit_int8_1x1:avx512_core_vnni", True, True),
    ("jit_deconvolution:avx512_core_vnni", True, True),
    ("brgconv:avx512_core_vnni", True, True),
    ("brgconv_1x1:avx512_core_amx", True, True),
    ("brgconv:avx512_core_amx", True, True),
    ("jit:avx512_core_amx", True, True),
    ("jit_deconvolution:avx512_core_amx", True, True),
    ("brg:avx512_core_amx", True, True),  # matmul
    ("brg:avx512_core_vnni", True, True),
    ("brg:avx2", False, False),
    ("brg_conv:avx512_core_amx+brgconv_strided:avx512_core_amx", True, True),
    ("brg_conv:avx512_core_vnni+brgconv:avx512_core_vnni", True, True),
    ("brdgmm_dw:avx512_core_vnni", True, True),
    ("ref:any", True, True),  # int32 scalar loops
    ("conv:any+ref:any", True, True),
    ("gemm_s8u8s32:ref", True, True),
    ("gemm:jit", False, True),  # matmul on oneDNN's int8 GEMM: vpdpbusd iff the CPU has VNNI
    ("x64:gemm_s8u8s32:jit", False, True),
    ("x64:gemm_s8s8s32:jit", False, True),
    ("conv:any+x64:gemm_s8u8s32:jit", False, True),
    ("conv:any+jit_uni_int8:avx2", False, False),
    ("x64:gemm_s8u8s32:blas", False, False),  # unknown kernels: split (exact anywhere)
    ("conv:any", False, False),
    ("", False, False),
]


@pytest.mark.parametrize("impl, on_avx2, on_vnni", IMPL_TABLE)
def test_implementation_classification(impl: str, on_avx2: bool, on_vnni: bool) -> None:
    assert impl_is_exact(impl, CpuIsa.avx2) is on_avx2
    assert impl_is_exact(impl, CpuIsa.avx512_core_vnni) is on_vnni
    assert impl_is_exact(impl, CpuIsa.avx512_core_amx) is on_vnni


def test_nothing_changes_on_vnni_or_amx() -> None:
    if SPLITS_INT8:
        pytest.skip("this CPU has no VNNI")
    info = compile_model(zoo.quantized_model("resnet")).inspect()
    assert info["exact_int8_dot_products"]
    assert info["exact_int8"] == {}
    assert not any("exact_int8" in k or k["name"].endswith(":lo") for k in info["kernels"])


# ------------------------------------------------------------------ no VNNI
def _conv(c: int, o: int, *, src: DType = U8, weights: np.ndarray | None = None,
          seed: int = 0, hw: int = 9, n: int = 2,
          **conv: object) -> tuple[Graph, dict[str, np.ndarray]]:
    """A full-range int8 conv: src 0..255 (or −128..127), weights −128..127 unless given."""
    g = Graph("conv")
    zp = 7 if src == U8 else -3
    x = int_input(g, "x", (n, c, hw, hw), src, 0.03, zp)
    node = add_int8_conv(g, x, o, seed=seed, **conv)  # type: ignore[arg-type]
    value = g.values[node.inputs[1]]  # add_int8_conv draws −127..127: take −128..127
    assert value.data is not None
    shape = value.data.shape
    rng = np.random.default_rng(seed + 5)
    data = rng.integers(-128, 128, shape) if weights is None else weights.reshape(shape)
    value.data = data.astype(np.int8)
    value.data.setflags(write=False)
    g.outputs.append(node.outputs[0])
    return g, {"x": random_int(np.random.default_rng(seed + 1), (n, c, hw, hw), src)}


def _agreement(graph: Graph, feeds: dict[str, np.ndarray], mode: str = "fused",
               exact_int8: bool = True) -> tuple[int, float, int, float, dict[str, str]]:
    """(max LSB, identical share) against oneDNN's model on the exact accumulator and
    against the chain's meaning, and how each kernel was made exact. f32 outputs: 0 LSB
    means bit-equal to the model / within 1e-5 relative of the chain, else 1."""
    plan = lower_built(graph, Options(mode=mode, exact_int8=exact_int8))
    out = Executor(plan).run(feeds)[graph.outputs[0]]
    node = graph.producer(graph.outputs[0])
    assert node is not None
    inputs = [feeds.get(v, graph.constant(v)) for v in node.inputs]
    model = exact_expected(graph, node, inputs)
    chain = ref_eval(graph, feeds)[graph.outputs[0]]
    if out.dtype.kind == "f":
        close = np.allclose(out, chain, rtol=1e-5, atol=1e-5)
        model_lsb, model_same = int(not np.array_equal(out, model)), 1.0
        chain_lsb, chain_same = int(not close), 1.0
    else:
        model_lsb, model_same = step_diff(out, model)
        chain_lsb, chain_same = step_diff(out, chain)
    for kernel in plan.kernels:
        if kernel.kind in ("convolution", "deconvolution", "matmul"):
            assert not kernel.impl.startswith("ref"), kernel.impl
    return model_lsb, model_same, chain_lsb, chain_same, dict(plan.notes["exact_int8"])


@no_vnni
def test_isa_is_not_exact() -> None:
    want = os.environ.get("QFUSE_ONEDNN_ISA")
    assert want is None or effective_cpu_isa().name == want


@no_vnni
@pytest.mark.parametrize("case", ["3x3_c64", "1x1_c96", "3x3_stride2"])
def test_full_range_u8_conv_is_exact_only_with_the_split(case: str) -> None:
    conv = {"3x3_c64": {"c": 64, "o": 32},
            "1x1_c96": {"c": 96, "o": 64, "kernel": 1, "pads": (0, 0, 0, 0)},
            "3x3_stride2": {"c": 48, "o": 32, "stride": 2}}[case]
    graph, feeds = _conv(**conv)  # type: ignore[arg-type]
    model_lsb, _, chain_lsb, chain_same, how = _agreement(graph, feeds)
    assert how["conv:lo"] == LOW_HALF and how["conv"].startswith(SPLIT), how
    assert model_lsb == 0  # bit for bit oneDNN's model on the exact sum (K ≤ 1028)
    assert chain_lsb <= 1 and chain_same >= 0.999
    # without the split: int16 saturation of channel pairs (measured: 3x3_c64 255 LSB with
    # 17 % of the outputs off, 1x1_c96 187 LSB / 25 %, 3x3_stride2 202 LSB / 19 %)
    plain_lsb, plain_same, *_ = _agreement(graph, feeds, exact_int8=False)
    assert plain_lsb >= 20 and plain_same < 0.95, (plain_lsb, plain_same)


@no_vnni
@pytest.mark.parametrize("case", ["3x3", "1x1", "3x3_stride2", "s8_src", "odd_channels",
                                  "rgb", "grouped", "grouped_1x1"])
def test_pair_safe_weights_are_exact(case: str) -> None:
    """Trained-like weights (a few pairs past int16): pair-safe weights ``m`` and their
    excess on the even input channels, 0 LSB from the exact accumulator's model; oneDNN's
    saturating kernel alone is off."""
    conv = {"3x3": {"c": 64, "o": 32},
            "1x1": {"c": 96, "o": 64, "kernel": 1, "pads": (0, 0, 0, 0)},
            "3x3_stride2": {"c": 48, "o": 32, "stride": 2, "hw": 24},
            "s8_src": {"c": 64, "o": 32, "src": S8},
            "odd_channels": {"c": 37, "o": 32},
            "rgb": {"c": 3, "o": 32, "hw": 64, "stride": 2},
            "grouped": {"c": 64, "o": 64, "group": 4},  # ResNeXt / RegNet
            "grouped_1x1": {"c": 128, "o": 64, "group": 2, "kernel": 1, "pads": (0, 0, 0, 0),
                            "hw": 24}}[case]
    conv = {"hw": 16, **conv}
    c, o = int(conv["c"]), int(conv["o"])  # type: ignore[call-overload]
    k, g = int(conv.get("kernel", 3)), int(conv.get("group", 1))  # type: ignore[call-overload]
    weights = _tailed((o, c // g, k, k), 7)
    if case == "rgb":  # a stem's three channels: make the first pair saturate somewhere
        weights[:4, :2] = 120
    graph, feeds = _conv(weights=weights, **conv)  # type: ignore[arg-type]
    plan = lower_built(graph, Options())
    assert next(k for k in plan.kernels if k.name == "conv").impl in PAIRED_IMPLS
    model_lsb, _, chain_lsb, chain_same, how = _agreement(graph, feeds)
    assert PAIRED in how["conv"] and how["conv:lo"] == EXCESS, how
    assert model_lsb == 0 and chain_lsb <= 1 and chain_same >= 0.999
    # (the stem's and the grouped 1x1's saturated sums lie past the output's range anyway)
    if case not in ("rgb", "grouped_1x1"):
        plain_lsb, plain_same, *_ = _agreement(graph, feeds, exact_int8=False)
        assert plain_lsb >= 1 and plain_same < 1.0, (plain_lsb, plain_same)


@no_vnni
@pytest.mark.parametrize("kernel", [1, 3])
def test_nested_excess_is_exact(kernel: int) -> None:
    """Uniform weights: the excess of the excess runs as a third kernel over the even
    channels of the even copy, its sums added into the second kernel's T: bit for bit the
    exact accumulator's model, where oneDNN's saturating kernel alone is off."""
    outputs = 32 if kernel == 3 else 64  # (a million MACs saved at least: PAIR_MIN_MACS)
    weights = np.random.default_rng(8).integers(-128, 128, (outputs, 64, kernel, kernel))
    conv = {"kernel": kernel, "pads": (kernel // 2,) * 4, "hw": 16 if kernel == 3 else 32}
    graph, feeds = _conv(64, outputs, weights=weights.astype(np.int8), **conv)  # type: ignore
    model_lsb, _, chain_lsb, chain_same, how = _agreement(graph, feeds)
    assert PAIRED in how["conv"] and "excess's own excess" in how["conv"], how
    assert [name for name, what in how.items() if what == EXCESS] == ["conv:lo", "conv:lo#1"]
    assert model_lsb == 0 and chain_lsb <= 1 and chain_same >= 0.999
    plain_lsb, plain_same, *_ = _agreement(graph, feeds, exact_int8=False)
    assert plain_lsb >= 1 and plain_same < 1.0, (plain_lsb, plain_same)


@no_vnni
def test_pair_safe_weights_of_a_long_reduction() -> None:
    """K = 4608 (512 channels, 3x3): ``255·Σ|m|`` passes 2^24, so ``f32(acc_m) + T`` could
    round twice on an adversarial input — as the halves' ``f32(2·acc_hi) + T`` could, which
    were taken instead at twice the MACs. Pair-safe now, and on these inputs (|acc| far below
    2^24, as real activations give) bit for bit the exact accumulator's model."""
    weights = _tailed((16, 512, 3, 3), 11)
    m, e = pair_split(weights)  # type: ignore[misc]
    assert e is not None and 255 * int(np.abs(m.astype(np.int32)).sum((1, 2, 3)).max()) > 2 ** 24
    graph, feeds = _conv(512, 16, weights=weights, hw=8)
    model_lsb, _, chain_lsb, chain_same, how = _agreement(graph, feeds)
    assert PAIRED in how["conv"] and how["conv:lo"] == EXCESS, how
    assert model_lsb == 0 and chain_lsb <= 1 and chain_same >= 0.999


@no_vnni
@pytest.mark.parametrize("kernel, group", [(1, 1), (3, 1), (3, 4)])
def test_kernels_pair_neighbouring_input_channels(kernel: int, group: int) -> None:
    """What pair-safe weights rely on: the kernels of PAIRED_IMPLS add input channels 2k and
    2k + 1 in one int16 lane. Along the input channels the weights go 100, −100, −100, 100:
    pairs (2k, 2k + 1) cancel, any other pairing (2k + 1, 2k + 2), (k, k + 4), … adds two
    100s or two −100s of inputs near 255 and saturates by thousands. Nothing is split, and
    the accumulators are exact."""
    c, o = 64, 16
    signs = np.where(np.arange(o) % 2, 1, -1).astype(np.int8)
    row = np.tile(np.array([100, -100, -100, 100], np.int8), c // group // 4)
    weights = np.broadcast_to((signs[:, None] * row)[:, :, None, None],
                              (o, c // group, kernel, kernel))
    pads = (kernel // 2,) * 4
    graph, feeds = _conv(c, o, weights=np.ascontiguousarray(weights), kernel=kernel, pads=pads,
                         hw=16, group=group)
    feeds["x"] = np.random.default_rng(9).integers(230, 256, feeds["x"].shape).astype(np.uint8)
    plan = lower_built(graph, Options())
    assert [k.impl for k in plan.kernels if k.kind == "convolution"][0] in PAIRED_IMPLS
    model_lsb, _, _, _, how = _agreement(graph, feeds)
    assert "no split needed (every pair of neighbouring input channels" in how["conv"], how
    assert model_lsb == 0
    # the control: shifted by one channel, pairs (2k, 2k + 1) add two 100s and saturate
    shifted = np.ascontiguousarray(np.roll(weights, 1, axis=1))
    graph, _ = _conv(c, o, weights=shifted, kernel=kernel, pads=pads, hw=16, group=group)
    plain_lsb, plain_same, *_ = _agreement(graph, feeds, exact_int8=False)
    assert plain_lsb >= 20 and plain_same < 0.5, (plain_lsb, plain_same)


@no_vnni
@pytest.mark.parametrize("case", ["s8_src", "s8_src_grouped", "s8_src_depthwise",
                                  "s8_src_deconv"])
def test_s8_src_is_shifted_to_u8(case: str) -> None:
    conv = {"s8_src": {"c": 32, "o": 32},
            "s8_src_grouped": {"c": 32, "o": 32, "group": 4},
            "s8_src_depthwise": {"c": 32, "o": 32, "group": 32, "dst": S8, "out_zp": -3},
            "s8_src_deconv": {"c": 32, "o": 16, "stride": 2, "deconv": True}}[case]
    graph, feeds = _conv(src=S8, **conv)  # type: ignore[arg-type]
    model_lsb, _, chain_lsb, chain_same, how = _agreement(graph, feeds)
    assert "s8 src shifted to u8" in how["conv"]
    assert ("split weights" in how["conv"]) == (case != "s8_src_depthwise")
    assert model_lsb == 0 and chain_lsb <= 1 and chain_same >= 0.999
    # without: the conv kernels halve the weights (rint(w/2)) for s8 src (measured: 15, 7
    # and 3 LSB; 26 %, 29 % and 18 % of the outputs off). This s8 deconvolution with its
    # post-ops has only ref:any (exact, slow) unsplit; shifted and split it runs on jit kernels.
    plain_lsb, plain_same, *_ = _agreement(graph, feeds, exact_int8=False)
    if case != "s8_src_deconv":
        assert plain_lsb >= 2 and plain_same < 0.9


@no_vnni
@pytest.mark.parametrize("case", ["grouped", "depthwise", "deconv_stride2_outpad",
                                  "deconv_grouped_k4", "small_weights", "f32_dst",
                                  "1x1_image", "1x1_images"])
def test_other_convolutions(case: str) -> None:
    conv = {"grouped": {"c": 32, "o": 64, "group": 4},
            "depthwise": {"c": 32, "o": 32, "group": 32, "dst": S8, "out_zp": -3},
            "deconv_stride2_outpad": {"c": 32, "o": 16, "stride": 2, "deconv": True,
                                      "output_padding": 1},
            "deconv_grouped_k4": {"c": 32, "o": 32, "kernel": 4, "stride": 2, "group": 2,
                                  "deconv": True},
            "small_weights": {"c": 64, "o": 32},
            "f32_dst": {"c": 64, "o": 16, "dst": DType.F32},
            # a squeeze-excitation FC: its main primitive reads the low half as a binary
            # post-op in the dst's channels-last strides (jit; plain ones: ref:any)
            "1x1_image": {"c": 256, "o": 64, "kernel": 1, "pads": (0, 0, 0, 0), "hw": 1,
                          "n": 1},
            # batch 2
            "1x1_images": {"c": 256, "o": 64, "kernel": 1, "pads": (0, 0, 0, 0), "hw": 1}}[case]
    weights = None
    if case == "small_weights":
        weights = np.random.default_rng(2).integers(-64, 65, 32 * 64 * 9).astype(np.int8)
    graph, feeds = _conv(weights=weights, **conv)  # type: ignore[arg-type]
    model_lsb, _, chain_lsb, chain_same, how = _agreement(graph, feeds)
    split = case not in ("depthwise", "small_weights")
    assert ("split weights" in how["conv"]) == split, how
    assert model_lsb == 0 and chain_lsb <= 1 and chain_same >= 0.999
    if case.startswith("1x1_image"):  # (no ref:any kernel: _agreement asserts it)
        assert "halves added by a binary primitive" not in how["conv"], how


@no_vnni
def test_deconv_finish_runs_in_rows_of_pixels() -> None:
    """The binary finish of a split deconvolution (per-channel post-ops over a channels-last
    map) runs over rows of several pixels, its per-channel operands tiled (no_vnni
    ``_finish_rows``; PP-OCRv4 det QDQ's 4.6 → 1.85 ms); 0 LSB from the exact model."""
    graph, feeds = _conv(32, 16, stride=2, deconv=True, hw=24, n=1, output_padding=1)
    kernels = lower_built(graph, Options()).inspect()["kernels"]
    finish = next(k for k in kernels if k["name"] == "conv")
    dims = re.search(r"\(([\d, ]+)\)", finish["src_layouts"][0])
    assert finish["primitive"] == "binary" and dims is not None, finish
    rows, width = (int(d) for d in dims.group(1).split(","))
    assert width % 16 == 0 and width > 16 and rows * width == 16 * 48 * 48, finish
    model_lsb, _, chain_lsb, chain_same, how = _agreement(graph, feeds)
    assert "halves added by a binary primitive" in how["conv"], how
    assert model_lsb == 0 and chain_lsb <= 1 and chain_same >= 0.999


@pytest.fixture
def no_float_matmul(monkeypatch: pytest.MonkeyPatch) -> None:
    """The split path of int8 matmuls: the float32 one (lower_matmul._exact_in_f32), which
    takes these small-K cases first, off."""
    monkeypatch.setattr(lower_matmul, "_exact_in_f32", lambda *args: False)


@no_vnni
@pytest.mark.parametrize("name", list(MATMUL_CASES))
def test_matmul(name: str, no_float_matmul: None) -> None:
    """Constant s8 and u8 (zero point 120) weights, activation × activation (runtime weights
    split by two kernels, weight zero points split too)."""
    graph, feeds = matmul_graph(**MATMUL_CASES[name])
    model_lsb, _, chain_lsb, chain_same, how = _agreement(graph, feeds)
    assert "split weights" in how["mm"], how
    assert model_lsb == 0 and chain_lsb <= 1 and chain_same >= 0.999


@no_vnni
@pytest.mark.parametrize("name", list(MATMUL_CASES))
def test_matmul_in_float32(name: str) -> None:
    """Where ``K · max|x - zp_x| · max|w - zp_w| < 2^24`` (K ≤ 64 here) the int8 MatMul is a
    float32 matmul over the integer operands: every partial sum is an integer float32 holds,
    so it is bit-identical to oneDNN's model on the exact accumulator, with no split."""
    graph, feeds = matmul_graph(**MATMUL_CASES[name])
    model_lsb, _, chain_lsb, chain_same, how = _agreement(graph, feeds)
    assert how["mm"].startswith("float32 matmul"), how
    assert model_lsb == 0 and chain_lsb <= 1 and chain_same >= 0.999
    names = [k.name for k in lower_built(graph, Options()).kernels]
    assert "mm:lo" not in names and "mm" in names, names


@no_vnni
def test_float_matmul_declined_falls_back_to_split(monkeypatch: pytest.MonkeyPatch) -> None:
    """Should oneDNN decline the float32 form (here: its store), what it added is undone and
    the node runs split as before: the same integers, no float32 matmul or its reorders."""
    graph, feeds = matmul_graph(**MATMUL_CASES["2d"])

    def declined(*args: object) -> None:
        raise UnsupportedModelError("declined for the test")

    monkeypatch.setattr(lower_matmul, "_store_exact_f32", declined)
    model_lsb, _, _, _, how = _agreement(graph, feeds)
    assert "split weights" in how["mm"] and model_lsb == 0, how
    notes = [k.info.note or "" for k in lower_built(graph, Options()).kernels]
    assert not any(lower_matmul.FLOAT_MATMUL in n for n in notes), notes


@no_vnni
@pytest.mark.parametrize(("k", "in_f32"), [(267, True), (268, False)])
def test_float_matmul_bound(k: int, in_f32: bool) -> None:
    """The bound is the worst case of the src's range and of the weights themselves: u8 src
    with zero point 9 (|x - 9| ≤ 246), u8 weights with zero point 0 reaching 255:
    267 · 246 · 255 < 2^24 ≤ 268 · 246 · 255. Past it the weights are split."""
    graph, feeds = matmul_graph((3, k), (k, 16), b_const=True, b_dtype=U8, wei_zp=0)
    assert graph.constant("b").max() == 255  # the bound's weight magnitude is drawn
    feeds["a"][:] = 255  # and every partial sum at its largest
    model_lsb, _, _, _, how = _agreement(graph, feeds)
    assert how["mm"].startswith("float32 matmul") is in_f32, how
    assert model_lsb == 0


@no_vnni
@pytest.mark.parametrize("name", ["s8_src", "s8_src_act_x_act"])
def test_s8_matmul_src_is_read_as_u8(name: str, no_float_matmul: None) -> None:
    """oneDNN's GEMM runs an s8 src 2.5x slower than u8 without VNNI: the src is shifted by
    one reorder (x + 128, src zero point + 128); exact, the weights split as before."""
    graph, feeds = matmul_graph(**MATMUL_CASES[name])
    plan = lower_built(graph, Options())
    shifts = [k for k in plan.kernels if "s8 src as u8" in (k.info.note or "")]
    assert len(shifts) == 1, [k.info.note for k in plan.kernels]
    model_lsb, _, chain_lsb, chain_same, how = _agreement(graph, feeds)
    assert "split weights" in how["mm"], how
    assert model_lsb == 0 and chain_lsb <= 1 and chain_same >= 0.999


@no_vnni
@pytest.mark.parametrize("n", [1, 2])
def test_unfused_squeeze_excitation_fc_splits_on_jit(n: int) -> None:
    """Unfused mode too: the main primitive reads the low half as a binary post-op laid out
    channels-last (no_vnni ``_lo_layout``), on a jit kernel (no ref:any: _agreement checks),
    the chain then op by op."""
    graph, feeds = _conv(c=256, o=64, kernel=1, pads=(0, 0, 0, 0), hw=1, n=n)
    _, _, chain_lsb, chain_same, how = _agreement(graph, feeds, mode="unfused")
    assert how["conv"].startswith(SPLIT), how
    assert chain_lsb <= 1 and chain_same >= 0.999


@no_vnni
def test_unfused_mode_accumulator_is_exact() -> None:
    graph, feeds = _conv(64, 32)
    _, _, chain_lsb, chain_same, how = _agreement(graph, feeds, mode="unfused")
    assert how["conv"].startswith(SPLIT) and chain_lsb <= 1 and chain_same >= 0.999
    plain_lsb, *_ = _agreement(graph, feeds, mode="unfused", exact_int8=False)
    assert plain_lsb >= 20


@no_vnni
def test_residual_sum_and_post_op_order() -> None:
    """The sum post-op reads the residual after the split's own post-ops (index shift)."""
    g = Graph("residual")
    x = int_input(g, "x", (1, 64, 8, 8), U8, 0.04, 5)
    a = add_int8_conv(g, x, 32, kernel=1, pads=(0, 0, 0, 0), name="proj", out_scale=0.0613,
                      out_zp=3, seed=4)
    node = add_int8_conv(g, x, 32, residual=a.outputs[0], name="conv", out_scale=0.0837,
                         out_zp=2)
    g.outputs.append(node.outputs[0])
    feeds = {"x": random_int(np.random.default_rng(0), (1, 64, 8, 8), U8)}
    out, plan = run_plan(g, feeds)
    values = Executor(plan).run_all(feeds)
    inputs = [values.get(v, g.constant(v)) for v in node.inputs]
    assert step_diff(out[g.outputs[0]], exact_expected(g, node, inputs))[0] == 0
    kernel = next(k for k in plan.inspect()["kernels"] if k["name"] == "conv")
    assert kernel["post_ops"][:3] == ["binary_add", "binary_mul", "binary_add"]
    assert "sum" in kernel["post_ops"] and plan.notes["in_place_sums"] == 1


@no_vnni
@pytest.mark.parametrize("deconv", [False, True], ids=["conv", "deconv"])
def test_residual_on_either_path(deconv: bool) -> None:
    """A deconvolution's split normally ends in a binary primitive (no_vnni.py); with a
    residual sum it takes the conv path (binary_add post-op, on a slower kernel)."""
    g = Graph("residual")
    x = int_input(g, "x", (1, 32, 8, 8), U8, 0.04, 5)
    shape = (1, 16, 16, 16) if deconv else (1, 16, 8, 8)
    r = int_input(g, "r", shape, U8, 0.0613, 3)
    conv = {"kernel": 4, "stride": 2, "deconv": True} if deconv else {}
    node = add_int8_conv(g, x, 16, residual=r, name="conv", out_scale=0.0837, out_zp=2,
                         **conv)  # type: ignore[arg-type]
    g.outputs.append(node.outputs[0])
    rng = np.random.default_rng(3)
    feeds = {"x": random_int(rng, (1, 32, 8, 8), U8), "r": random_int(rng, shape, U8)}
    model_lsb, _, chain_lsb, chain_same, how = _agreement(g, feeds)
    assert how["conv"].startswith(SPLIT)
    assert model_lsb == 0 and chain_lsb <= 1 and chain_same >= 0.999


@no_vnni
def test_accumulators_beyond_2_24() -> None:
    """K = 2304, large same-sign products: acc ≈ 5.8e7, |acc_hi| > 2^24, so f32(2·acc_hi) +
    acc_lo may round twice (no_vnni.py): ≤ 1 LSB. The chain spreads each channel's range
    over the u8 outputs (1 LSB ≈ 3e4 accumulator units, far above the f32 ulp of 4).
    Measured with 4 seeds: 0 LSB everywhere; without the split 170 LSB, 98-99 % off."""
    rng = np.random.default_rng(9)
    weights = rng.integers(100, 128, 32 * 256 * 9).astype(np.int8)
    graph, _ = _conv(256, 32, weights=weights)
    feeds = {"x": rng.integers(200, 256, (2, 256, 9, 9)).astype(np.uint8)}
    node = graph.node("conv")
    assert node.fused is not None
    acc = accumulate(node, [feeds["x"], graph.constant(node.inputs[1])]).astype(np.float64)
    assert np.abs(acc).max() > 2 ** 25  # 2·|acc_hi| > 2^25
    lo, hi = acc.min(axis=(0, 2, 3)), acc.max(axis=(0, 2, 3))
    scale = 0.05 * 250 / (hi - lo)
    chain = [Scale.of(scale), Shift.of(-lo * scale), quantize_item(0.05, 0, U8)]
    node.fused = Fused(chain=chain, src_zero_point=node.fused.src_zero_point)
    model_lsb, model_same, _, _, how = _agreement(graph, feeds)
    assert how["conv"].startswith(SPLIT) and model_lsb <= 1 and model_same >= 0.999
    plain_lsb, plain_same, *_ = _agreement(graph, feeds, exact_int8=False)
    assert plain_lsb >= 100 and plain_same < 0.5  # every pair saturates


# ------------------------------------------------------------------ the subprocess
def test_under_avx2(tmp_path: Path) -> None:
    """This module, test_lower_zoo.py's int8 checks and vector_matmul_as_conv's tests under
    ONEDNN_MAX_CPU_ISA=AVX2; then every zoo value computed there equals this ISA's: integers
    bit for bit, floats (softmax, layer norm, gelu run on other kernels) within 1e-5
    relative."""
    dump = tmp_path / "avx2.npz"
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "QFUSE_ONEDNN_ISA": "avx2"}
    zoo_tests = ["tests/compiler/test_lower_zoo.py::test_int8_modes_agree_per_kernel_and_end_to_end",
                 "tests/compiler/test_lower_zoo.py::test_fused_matches_onnxruntime",
                 "tests/compiler/test_lower_zoo.py::test_every_int8_kernel_is_exact_or_split",
                 # matmul rows as 1x1 convolutions, where the GEMM packs weights (AVX2)
                 "tests/passes/test_vector_matmul_as_conv.py"]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
         "-k", "not under_avx2 and not nothing_changes", str(Path(__file__)), *zoo_tests],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    summary = re.search(r"(\d+) passed", output)
    assert summary and int(summary.group(1)) >= 45, output
    assert "skipped" not in output, output
    dumped = subprocess.run(
        [sys.executable, "-c", ("import sys, numpy as np; from tests.compiler.lower_helpers "
                               "import zoo_values; np.savez(sys.argv[1], **zoo_values())"),
         str(dump)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert dumped.returncode == 0, dumped.stderr
    theirs = np.load(dump)
    ours = zoo_values()
    # Only the names of the two rewrites that depend on the ISA may differ:
    # vector_matmul_as_conv's views ("@image") rewrite a MatMul where oneDNN's matmul is the
    # weight-packing GEMM (AVX2) and keep the matmul where it is brgemm (VNNI / AMX);
    # deconv_as_depth_to_space's 1x1 convolution output ("@cells") replaces a deconvolution
    # with many output channels only where its exact int8 form would be split (no VNNI).
    assert all("@image" in key or "@cells" in key for key in set(theirs.files) ^ set(ours)), (
        set(theirs.files) ^ set(ours))
    for key in set(theirs.files) & set(ours):
        a, b = theirs[key], ours[key]
        if a.dtype.kind in "iu":
            assert np.array_equal(a, b), key
        else:
            scale = max(1.0, float(np.abs(b).max(initial=0)))
            assert float(np.abs(a - b).max(initial=0)) <= 1e-5 * scale, key
