"""Exact int8 convolutions, deconvolutions and matmuls on implementations without VNNI / AMX.

oneDNN's int8 kernels generated for an ISA without VNNI (sse41, avx2, avx512_core) are not
exact (oneDNN's developer guide, "Nuances of int8 Computations"; docs/onednn.md "Pitfalls";
each rule measured to 0 LSB in tests/runtime/test_onednn_int8.py under AVX2):

- u8 src: ``vpmaddubsw`` adds the products of two adjacent input channels (K positions for
  the GEMM kernels) in int16 with saturation, ``sat16(x0·w0 + x1·w1)``. No pair can leave
  int16 when every |w| ≤ 64: 255·64·2 = 32640 ≤ 32767.
- s8 src conv / deconv: the kernel stores ``rint(w/2)`` and doubles the sum — wrong for every
  odd weight, whatever the inputs.
- Depthwise conv (one input and one output channel per group) multiplies in int32: exact for
  u8 src (measured, also after the s8 → u8 shift below).

The split. With ``hi = rint(w/2)`` (half to even: what a oneDNN reorder with scale 0.5
computes, so constant and runtime weights split alike) and ``lo = w − 2·hi``:

    w = 2·hi + lo,   hi ∈ [−64, 64],   lo ∈ {−1, 0, 1}
    acc = Σ (x − zp)·w = 2·acc_hi + acc_lo        both halves exact in the int16 kernels

A matmul weight zero point splits alike: ``zp_w = 2·zh + zl``, ``zl ∈ {0, 1}``. An s8 src of a
(de)convolution is first shifted to u8 by a reorder (``x + 128``, exact) with src zero point
``zp + 128``, so only the u8 rule applies. (The GEMM matmul kernels already handle s8 src as
``x + 128``: measured exact with split weights.)

Two primitives replace one. For the composed attributes (weight scales ws, bias b, post-ops P,
dst scale and zero point) of the node:

    lo    same src and src zero point, weights lo (zero point zl), no scales, f32 dst
          T = f32(acc_lo)                                 exact: |acc_lo| ≤ 255·K < 2^24
    main  weights hi (zero point zh), weight scale 2 (mask 0), no bias, post-ops
          binary_add(T)                  x = f32(2·acc_hi) + T, rounded once = f32(acc)
          linear(ws) or binary_mul(ws)   x = f32(x·ws)      oneDNN's weight scale
          linear(1, b) or binary_add(b)  x = f32(x + b)     oneDNN's bias
          then P, dst scale and dst zero point unchanged

so ``main`` computes ``runtime/reference/chain.apply_composed(acc, composed)`` bit for bit: the
same float32 roundings in the same order as the single primitive on a VNNI machine (eltwise
linear is one FMA: ``fma(x, ws, 0) = f32(x·ws)``, ``fma(x, 1, b) = f32(x + b)``).
Precondition: ``f32(acc_hi)`` exact, i.e. ``|acc_hi| ≤ 2^24`` — always true for K ≤ 1028
without a weight zero point (255·64·K); beyond it ``f32(2·acc_hi) + T`` may round twice,
which moves x by at most one float32 ulp of acc and can flip the output by 1 LSB only on a
near-tie (tests/compiler/test_lower_no_vnni.py drives |acc| to 5.8e7: no flip seen). Scaling
the halves separately, ``acc_hi·2ws + b + acc_lo·ws``, would save the two per-channel
post-ops but is not bit-exact: it flips near-ties.

Pair-safe weights (convolutions, grouped ones with an even count of at least
``MIN_GROUP_CHANNELS`` input channels a group, on the kernels of ``PAIRED_IMPLS``). The
halves double the MACs, yet in real layers only about 1 % of the pairs can leave int16: the
weights' tails are rare, and a pair saturates only when both its weights have one sign and
add up past 128 (``255·(w0 + w1) > 32767``; opposite signs never do). These kernels pair input
channels 2k and 2k + 1 (their weights hold four consecutive input channels innermost and
``vpmaddubsw`` adds neighbouring bytes; measured with weights whose other pairings saturate,
tests/compiler/test_lower_no_vnni.py). So with, per pair and output channel and tap,

    e_{2k} = w_{2k} + w_{2k+1} − 128   where both are positive and add past 128
           = w_{2k} + w_{2k+1} + 128   where both are negative and add past −128
           = 0 elsewhere (and e_{2k+1} = 0),          m = w − e

every pair of ``m`` stays within int16 (its positive weights add to at most 128), and ``e``
lives on the even input channels only. ``m`` runs as the node's primitive, ``e`` as the ``lo``
kernel over a copy of the even input channels (one reorder of a strided view, shared by every
reader of that source), so the extra kernel has half the MACs: acc = acc_m + acc_e, with the
same main post-ops as above and weight scale 1 (``f32(acc_m) + T`` rounded once = f32(acc)
while ``|acc_m| ≤ 2^24``; beyond it the sum may round twice, as the halves' may, with the
same ≤ 1 LSB on near-ties: refusing such layers, as before, sent the large ones of random-
weight networks — 512 → 1024 channels, 3x3, K = 4608 — to the halves' twice the MACs for
nothing exacter). Taken when ``e``'s own pairs (channels 4j and 4j + 2) stay within int16,
the source has a strided
layout and the extra kernel saves at least ``PAIR_MIN_MACS`` (a copy and a kernel call cost
about what a million int8 MACs take on AVX2; less and the halves are as fast) on a kernel
that is not slow (with 2 input channels a group it is ``ref:any``). A group's even channels
are the source's even channels. With no such pair at all (``e = 0``) nothing is split.
The excess kernel reads the even channels only up to the last pair holding an excess
(``_leading_pairs``); passes/pair_channels.py orders a tensor's channels so that those pairs
come first and are few.
YOLOv8n QDQ 0.87x, PP-OCRv4 det NNCF 0.85x, a 224-channel conv in 2 groups 0.77x (2 threads,
AVX2).

Where ``e``'s own pairs could leave int16 (random-weight layers: with uniform weights a
quarter of the pairs hold an excess of up to 126, and two of those add past 128 somewhere),
``e`` is split the same way once more (``nested_pair_split``): ``e = e1 + e2`` with ``e2`` on
``e``'s even channels, input channels 4j. ``e2`` runs over the even channels of the even
copy (one more reorder), its f32 sums T2 the binary add post-op of ``e1``'s kernel:
``T = f32(acc_e1) + T2``, exact, then the main kernel as above. At most 1 + 1/2 + 1/4 of the
MACs where the halves take 2: Xception-41 QDQ 0.94x, DPN-68 NNCF 0.97x; trained weights
rarely need it (YOLOv8n QDQ: 2 layers, 1.00x). Taken on the same conditions as one excess.

Deconvolution: with a src zero point oneDNN's AVX2 int8 deconvolution takes neither the
full-tensor binary post-op nor a sum (it falls back to a GEMM-based kernel, 25x slower), so
its halves both run bare into f32 and a binary primitive adds them and applies the rest
(``Exactness.lower_with_binary``), with the same roundings.

Per primitive, not per CPU. What decides is the implementation oneDNN picked for the node's
unsplit primitive (created first, with its real attributes and layouts), not the CPU's ISA: a
VNNI CPU still runs some shapes on an avx2 kernel (measured on a Xeon with AVX-512 VNNI: a
grouped int8 ConvTranspose, groups 2, stride 2, kernel 4, on ``jit_uni_int8:avx2``, 19-30 LSB
off on 4 % of its outputs). ``impl_is_exact`` reads oneDNN 3.2's implementation names
(``JIT_IMPL_NAME_HELPER`` in src/cpu/x64/cpu_isa_traits.hpp: ``<kind>:<isa>``, the ISA the kernel
was generated for, ``avx2_vnni`` / ``avx512_core_vnni`` where it uses VNNI):

    <kind>:<isa>          exact iff the ISA has VNNI or AMX (avx2_vnni, avx2_vnni_2,
                          avx512_core_vnni, _bf16, _fp16, _amx, _amx_fp16); sse41, avx,
                          avx2, avx512_core saturate
    ref:any, *:ref        exact (int32 scalar loops)
    gemm:jit, x64:gemm_*  oneDNN's int8 GEMM picks vpdpbusd or vpmaddubsw at run time from the
                          CPU (mayiuse(avx512_core_vnni / avx2_vnni)): exact iff the effective
                          ISA has VNNI
    a+b (composites)      exact iff every part is (``conv:any+…``: the wrapper computes nothing)
    anything else         not exact (the split is exact on any implementation)

Not split: nodes whose unsplit primitive is on an exact implementation (nothing here runs, and
nothing is recorded), layers whose weights all lie in [−64, 64], depthwise convolutions (the
jit kernels widen to int16 and use ``vpmaddwd``: int32 products), and nodes whose shifted (u8)
primitive lands on an exact implementation (``ref:any``, or a VNNI kernel that takes u8 only).
Cost: on an exact implementation, none (its primitive is the one probed). Each split node runs
two int8 primitives (twice the MACs) and writes and reads one f32
tensor of its output's size: measured under AVX2 on the zoo models, 1.6x to 1.9x the latency
of the unsplit (inexact) plans (resnet 0.16 → 0.30 ms), ~1.0x where other kernels dominate.
``LowerContext.exact_int8`` records what was done per kernel (``inspect()["exact_int8"]``,
and each kernel's ``exact_int8`` field in ``CompiledModel.inspect()``), naming the
implementation that made it necessary.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Protocol

import numpy as np

from qfuse.compiler.lower.attrs import (
    BuiltAttr,
    SrcZeroPoint,
    TensorAdd,
    as_float_post_ops,
    build_attr,
    scale_bias_post_ops,
    tiled_channels,
)
from qfuse.compiler.lower.context import LowerContext
from qfuse.compiler.lower.layouts import (
    channels_last,
    dnnl_type,
    is_slow,
    md_like,
    plain_md,
    same_bytes,
)
from qfuse.compiler.lower.plan import Kernel, KernelInfo
from qfuse.ir import DType, Graph, Node, Op
from qfuse.ir.postops import Composed, Sum, TensorBinary, single_pixel_batch
from qfuse.ir.rows import repeats
from qfuse.passes.pair_channels import pairing_weights
from qfuse.runtime.numerics.pairs import PAIR_LIMIT, SAFE_WEIGHT
from qfuse.runtime.onednn import (
    Alg,
    Arg,
    CpuIsa,
    DataType,
    Memory,
    MemoryDesc,
    PrimitiveAttr,
    PrimitiveDesc,
    binary,
    effective_cpu_isa,
)

log = logging.getLogger(__name__)
F32 = np.float32

# ISAs with exact int8 dot products (VNNI / AMX): a jit kernel generated for one is exact.
EXACT_INT8_ISAS = frozenset({CpuIsa.avx2_vnni, CpuIsa.avx2_vnni_2, CpuIsa.avx512_core_vnni,
                             CpuIsa.avx512_core_bf16, CpuIsa.avx512_core_fp16,
                             CpuIsa.avx512_core_amx, CpuIsa.avx512_core_amx_fp16})
#: ISAs whose int8 kernels sum u8·s8 pairs in int16 (vpmaddubsw) or halve s8-src weights.
SATURATING_ISAS = frozenset({CpuIsa.sse41, CpuIsa.avx, CpuIsa.avx2, CpuIsa.avx512_core})
#: oneDNN 3.2 int8 convolution kernels measured to add input channels 2k and 2k + 1 in one
#: int16 lane (tests/compiler/test_lower_no_vnni.py); other kernels keep the halves.
PAIRED_IMPLS = frozenset({"jit_uni_int8:avx2", "jit_uni_int8_1x1:avx2"})
PAIR_MIN_MACS = 1_000_000
MIN_GROUP_CHANNELS = 16  # input channels a group from which a grouped conv takes them
SPLIT = "split weights (no VNNI)"
PAIRED = "pair-safe weights and their excess on the even input channels"
EXCESS = "excess of pair-safe weights (even input channels)"
SHIFT = "s8 src shifted to u8 (no VNNI)"
LOW_HALF = "low half of split weights"  # what the extra kernel of a split node is recorded as
HIGH_HALF = "high half of split weights"  # deconvolution: its third kernel

WeightsSlot = Callable[[PrimitiveDesc], str]


class Create(Protocol):
    """lower_compute / lower_matmul ``create``, with the weights it fills replaceable."""

    def __call__(self, built: BuiltAttr, dst_md: MemoryDesc | None, comp: Composed, *,
                 weights: np.ndarray | None = None, src_md: MemoryDesc | None = None
                 ) -> tuple[PrimitiveDesc, Memory | None]: ...


def isa_is_exact() -> bool:
    """Whether the CPU (as oneDNN sees it) has VNNI or AMX: its GEMM int8 kernels are exact."""
    return effective_cpu_isa() in EXACT_INT8_ISAS


_ISA_BY_NAME = {isa.name: isa for isa in EXACT_INT8_ISAS | SATURATING_ISAS}


def impl_is_exact(impl: str, isa: CpuIsa | None = None) -> bool:
    """Whether oneDNN's int8 implementation named ``impl`` sums u8·s8 products exactly in
    int32 (module docstring's table); ``isa``: the effective ISA (default: this process's),
    which decides oneDNN's int8 GEMM kernels."""
    parts = [p for p in impl.split("+") if p and p != "conv:any"]
    return bool(parts) and all(_part_is_exact(p, isa) for p in parts)


def _part_is_exact(name: str, isa: CpuIsa | None) -> bool:
    if name.startswith("ref:") or name.endswith(":ref"):
        return True
    if name in ("gemm:jit", "x64:gemm_s8u8s32:jit", "x64:gemm_s8s8s32:jit"):
        return (effective_cpu_isa() if isa is None else isa) in EXACT_INT8_ISAS
    suffix = _ISA_BY_NAME.get(name.rsplit(":", 1)[-1])
    return suffix is not None and suffix in EXACT_INT8_ISAS


def split_weights(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(hi, lo)`` with ``w = 2·hi + lo``, ``hi = rint(w/2)`` (module docstring)."""
    wide = w.astype(np.int16)
    hi = np.rint(wide.astype(F32) * F32(0.5)).astype(np.int16)
    return hi.astype(np.int8), (wide - 2 * hi).astype(np.int8)


def _pairs(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Input channels 2k and 2k + 1 of int8 weights ``[O, I, k…]`` as int16 (a zero channel
    after an odd count)."""
    wide = w.astype(np.int16)
    if wide.shape[1] % 2:
        wide = np.concatenate([wide, np.zeros_like(wide[:, :1])], axis=1)
    return wide[:, 0::2], wide[:, 1::2]


def _pairs_safe(w: np.ndarray) -> bool:
    """No pair of input channels (2k, 2k + 1) can leave int16 with u8 sources: the positive
    weights of each pair add to at most 128 and the negative ones to at least −128."""
    a, b = _pairs(w)
    return bool((np.maximum(a, 0) + np.maximum(b, 0) <= PAIR_LIMIT).all()
                and (np.minimum(a, 0) + np.minimum(b, 0) >= -PAIR_LIMIT).all())


def pair_split(w: np.ndarray, axis: int = 1) -> tuple[np.ndarray, np.ndarray | None] | None:
    """``(m, e)`` with ``w = m + e`` (module docstring, "Pair-safe weights"): every pair of
    ``m`` within int16, ``e`` zero on the odd input channels and returned as the even
    channels of complete pairs (``[O, ⌊I/2⌋, k…]``: the last channel of an odd count pairs
    with nothing, ``255·128`` fits); None when ``m = w``. None when ``e``'s own pairs could
    leave int16 (``nested_pair_split`` then, else the halves).
    ``axis``: the input channels' (2 for grouped weights ``[G, O/G, I/G, k…]``)."""
    if axis != 1:  # every group's output channels as rows of their own
        split = pair_split(w.reshape(-1, *w.shape[axis:]))
        if split is None:
            return None
        m, e = split
        if e is None:
            return w, None
        return m.reshape(w.shape), e.reshape(*w.shape[:axis], *e.shape[1:])
    m, e = _excess(w)
    if e is None:
        return w, None
    if not _pairs_safe(e):
        return None
    return m.astype(np.int8), e.astype(np.int8)


def nested_pair_split(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``(m, e1, e2)`` for weights ``[O, I, k…]`` whose excess ``e`` (``pair_split``) has
    pairs that could leave int16 itself: ``e`` split again the same way, ``e = e1 + e2`` with
    every pair of ``e1`` within int16 and ``e2`` on ``e``'s even channels (input channels
    4j), so ``w = m + e1 + e2`` runs as three kernels of at most 1, 1/2 and 1/4 of the MACs
    instead of the halves' 2. Random-weight layers need it: a quarter of their pairs hold an
    excess (uniform weights), and pairs of those excesses add past 128 again (Xception-41
    QDQ: 45 of its 47 pointwise layers). None when ``e2``'s own pairs could leave int16 too,
    or ``w`` needs no excess or ``pair_split`` suffices."""
    m, e = _excess(w)
    if e is None:
        return None
    e1, e2 = _excess(e.astype(np.int8))
    if e2 is None or not _pairs_safe(e2):
        return None
    return m.astype(np.int8), e1.astype(np.int8), e2.astype(np.int8)


def _excess(w: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """``(m, e)`` as int16, ``w = m + e``: ``e`` (``[O, ⌊I/2⌋, k…]``, the even input channels)
    the least that brings every pair of ``m`` within int16; ``e`` None when zero."""
    a, b = _pairs(w)
    half = w.shape[1] // 2
    over = np.maximum(a, 0) + np.maximum(b, 0) - PAIR_LIMIT
    under = np.minimum(a, 0) + np.minimum(b, 0) + PAIR_LIMIT
    e = (np.maximum(over, 0) + np.minimum(under, 0))[:, :half].astype(np.int16)
    if not e.any():
        return w.astype(np.int16), None
    m = w.astype(np.int16)
    m[:, 0:2 * half:2] -= e
    return m, e


def pairs_adjacent_channels(pd: PrimitiveDesc, axis: int = 1) -> bool:
    """Whether ``pd``'s int8 kernel adds the products of input channels 2k and 2k + 1 in one
    int16 lane: one of ``PAIRED_IMPLS`` with its weights blocked by an even number of
    consecutive input channels (dim ``axis``) innermost (``vpmaddubsw`` pairs neighbouring
    bytes)."""
    md = pd.weights_md
    blocks = md.inner_blocks if md is not None else ()
    return (pd.impl_name in PAIRED_IMPLS and bool(blocks) and blocks[-1][0] == axis
            and blocks[-1][1] % 2 == 0)


def split_zero_point(zp: int) -> tuple[int, int]:
    """``(zh, zl)`` with ``zp = 2·zh + zl``, ``zl ∈ {0, 1}``."""
    return zp // 2, zp % 2


def within_safe_range(w: np.ndarray) -> bool:
    return int(np.abs(w.astype(np.int16)).max(initial=0)) <= SAFE_WEIGHT


def _float_sum(op: object) -> bool:
    """A residual sum of a float32 tensor as it is: ``x + r``."""
    return (isinstance(op, Sum) and op.dtype is DType.F32 and op.scale == 1.0
            and op.zero_point == 0)


@dataclass
class Exactness:
    """How one int8 node stays exact without VNNI (module docstring)."""

    how: str  # recorded per kernel in inspect()
    shift_src: bool = False
    halves: tuple[np.ndarray, np.ndarray] | None = None  # constant weights (hi, lo)
    # a convolution's constant weights and their input channels' dim (2: grouped): pair-safe
    # weights are tried on them before the halves (``_apply_paired``)
    pairing: tuple[np.ndarray, int] | None = None
    runtime: str | None = None  # runtime s8 weights value, split at run time
    probed: bool = False  # the unsplit (shifted) primitive was checked (_on_exact_impl)
    deconv: bool = False  # a ConvTranspose (see needed)
    # lower_conv's s8 → u8 shift of the src, applied only when needed: -> (node, src zp)
    shift: Callable[[], tuple[Node, int]] | None = None

    def check_main(self, node: Node, pd: PrimitiveDesc) -> None:
        """Pair-safe weights are exact only on a kernel that pairs neighbouring input channels
        (or an exact one): the main primitive as made must be one, as its probe was."""
        if (self.pairing is not None and self.halves is None
                and not pairs_adjacent_channels(pd, self.pairing[1])
                and not impl_is_exact(pd.impl_name)):
            raise AssertionError(f"node {node}: pair-safe weights on {pd.impl_name}, which "
                                 "was not probed (pairs_adjacent_channels)")

    @property
    def splits(self) -> bool:
        return self.halves is not None or self.runtime is not None or self.pairing is not None

    def needed(self, impl: str) -> bool:
        """Called with the implementation of the node's unsplit primitive: False when nothing
        here applies, i.e. it is exact and not a reference kernel the plan may move to jit
        ones (shifting an s8 src; splitting a deconvolution, whose bare halves take jit
        kernels where the whole takes ``conv:any+ref:any``: measured under AVX2)."""
        exact = impl_is_exact(impl)
        if exact and not self._may_leave_ref(impl):
            return False
        if not exact:
            self.how = f"{self.how}; unsplit primitive on {impl}"
        self.probed = not exact  # known not exact: apply() need not create it again
        return True

    def _may_leave_ref(self, impl: str) -> bool:
        return "ref:" in impl and (self.shift_src or (self.deconv and self.splits))

    def shift_source(self) -> tuple[Node, int]:
        """Apply lower_conv's s8 → u8 shift (``unsigned_source``); the shifted primitive is
        probed again (``_on_exact_impl``)."""
        assert self.shift is not None
        self.shift_src, self.probed = False, False
        return self.shift()

    def apply(self, ctx: LowerContext, node: Node, composed: Composed, *, create: Create,
              weights_slot: WeightsSlot | None, channel_axis: int, wei_mask: int,
              src_zp: SrcZeroPoint, wei_zp: int, unsplit: Callable[[], PrimitiveDesc],
              main_pd: Callable[[Composed, np.ndarray], PrimitiveDesc] | None = None
              ) -> tuple[Composed, Create, WeightsSlot | None, int]:
        """Add the ``lo`` primitive; return what the main primitive is created with.
        ``unsplit()`` creates the node's primitive as it would be without the split: when
        that is on an exact implementation (``ref:any`` after the shift) nothing is split.
        ``main_pd(composed, weights)`` creates the main primitive: when it pairs input
        channels (``pairs_adjacent_channels``), pair-safe weights replace the halves."""
        if not self.splits or self._on_exact_impl(unsplit):
            return composed, create, weights_slot, wei_zp
        if self.pairing is not None and main_pd is not None:
            paired = self._apply_paired(ctx, node, composed, create, main_pd,
                                        channel_axis=channel_axis, wei_mask=wei_mask,
                                        src_zp=src_zp)
            if paired is not None:
                main, weights = paired
                return main, partial(create, weights=weights), weights_slot, wei_zp
        zh, zl = split_zero_point(wei_zp)
        t_md = _lo_layout(ctx, node)
        runtime = None if self.runtime is None else _split_runtime(ctx, self.runtime)
        t = self._add_lo(ctx, node, create, t_md, runtime, channel_axis=channel_axis,
                         wei_mask=wei_mask, src_zp=src_zp, wei_zp=zl)
        main = self.main_composed(ctx, node, composed, t)
        if self.halves is not None:
            create = partial(create, weights=self.halves[0])
        elif runtime is not None:
            hi = runtime[0]

            def weights_slot(pd: PrimitiveDesc) -> str:
                return ctx.source(hi, pd.weights_md)

        return main, create, weights_slot, zh

    def _apply_paired(self, ctx: LowerContext, node: Node, composed: Composed,
                      create: Create, main_pd: Callable[[Composed, np.ndarray], PrimitiveDesc],
                      *, channel_axis: int, wei_mask: int, src_zp: SrcZeroPoint
                      ) -> tuple[Composed, np.ndarray] | None:
        """The main primitive's attributes and weights with pair-safe weights ``m`` (module
        docstring), after the kernel of the excess ``e`` on the even input channels; None (the
        halves stay) when there are no such weights, oneDNN's kernel for them does not pair
        neighbouring input channels, or the source has no strided layout to take the even
        channels from. With no excess the node's own weights are exact on such a kernel:
        nothing is split."""
        assert self.pairing is not None
        weights, axis = self.pairing
        split = pair_split(weights, axis)
        e2 = None
        if split is None:
            nested = nested_pair_split(weights) if axis == 1 else None
            if nested is None:
                return None
            m, e, e2 = nested
            split = m, e
        m, e = split
        if e is None:
            if not pairs_adjacent_channels(main_pd(composed, m), axis):
                return None
            self.halves = self.pairing = None
            self.how = self.how.replace(SPLIT, "no split needed (every pair of neighbouring "
                                        "input channels within int16)")
            return composed, m
        pd = main_pd(self.main_composed(ctx, node, composed, "probe", scale=1.0), m)
        src_md = pd.src_md
        if not pairs_adjacent_channels(pd, axis) or src_md is None:
            return None
        src = ctx.source(node.inputs[0], src_md)
        e = _leading_pairs(e, axis)
        if e2 is not None:  # the even copy covers e2's channels too (e1 may end before)
            e2 = _leading_pairs(e2, 1)
            e = _widened(e, min(2 * e2.shape[1], m.shape[1] // 2))
        if axis == 1:
            e = _to_shared_copy(ctx, src, e, m.shape[1] // 2, node.inputs[0])
        prefix = e.shape[1] if axis == 1 and e.shape[1] < m.shape[1] // 2 else None
        extra = e.shape[axis] + (0 if e2 is None else e2.shape[1])
        saved = math.prod(ctx.info(node.outputs[0]).shape) * (m.shape[axis] - extra) \
            * math.prod(m.shape[axis + 1:])
        views = _even_views(ctx.slots[src].md, prefix)
        if views is None or (saved < PAIR_MIN_MACS and _even_name(src, prefix) not in ctx.home):
            return None
        t_md = _lo_layout(ctx, node)
        empty, built = self._lo_attr(ctx, node, channel_axis=channel_axis, wei_mask=wei_mask,
                                     src_zp=src_zp, wei_zp=0)
        if is_slow(create(built, t_md, empty, weights=e, src_md=views[1])[0].impl_name,
                   "convolution"):
            return None  # (measured: 2 channels per group on AVX2 run ref:any, 38x the halves)
        fourths, quarter = None, None
        if e2 is not None:  # e2 reads the even channels of the even copy
            quarter = e2.shape[1] if e2.shape[1] < e.shape[1] // 2 else None
            fourths = _even_views(views[1], quarter)  # views[1]: the even copy's md
            if fourths is None or is_slow(create(built, t_md, empty, weights=e2,
                                                 src_md=fourths[1])[0].impl_name,
                                          "convolution"):
                return None
        even = even_channels(ctx, src, views, prefix)
        addend = None
        if e2 is not None and fourths is not None:  # T2 = e2's sums, added into T
            addend = self._add_lo(ctx, node, create, t_md, None, channel_axis=channel_axis,
                                  wei_mask=wei_mask, src_zp=src_zp, wei_zp=0,
                                  excess=(e2, even_channels(ctx, even, fourths, quarter),
                                          fourths[1]))
        t = self._add_lo(ctx, node, create, t_md, None, channel_axis=channel_axis,
                         wei_mask=wei_mask, src_zp=src_zp, wei_zp=0,
                         excess=(e, even, views[1]), addend=addend)
        self.halves = None
        held = len(_pairs_held(e, axis))
        nested = "" if e2 is None else (
            f"; the excess's own excess on {len(_pairs_held(e2, 1))} pairs of channels 4j, "
            "4j + 2, a third kernel")
        self.how = self.how.replace(SPLIT, f"{PAIRED} ({held} of the {m.shape[axis] // 2} "
                                    f"pairs of input channels hold an excess{nested})")
        return self.main_composed(ctx, node, composed, t, scale=1.0), m

    def main_composed(self, ctx: LowerContext, node: Node, composed: Composed,
                      t: str, scale: float = 2.0) -> Composed:
        """The main primitive's attributes: weight scale 2 (1 for pair-safe weights), the low
        half or excess T (slot ``t``) added first, then the node's scales, bias and post-ops
        (module docstring)."""
        t_md = _lo_layout(ctx, node)
        return replace(composed, wei_scales=np.full(1, scale, F32), bias=None,
                       post_ops=[TensorAdd(t, t_md, f"low half '{t}'"),  # type: ignore[list-item]
                                 *scale_bias_post_ops(composed), *composed.post_ops])

    def lower_with_binary(self, ctx: LowerContext, node: Node, composed: Composed, *,
                          create: Create, channel_axis: int, wei_mask: int,
                          src_zp: SrcZeroPoint,
                          unsplit: Callable[[], PrimitiveDesc],
                          main_is_slow: Callable[[Composed], bool] | None = None,
                          into: str | None = None,
                          tensor_slot: Callable[[int], tuple[str, MemoryDesc]] | None = None
                          ) -> str | None:
        """Deconvolution: oneDNN's AVX2 int8 deconvolution with a src zero point takes
        neither a full-tensor binary nor a sum post-op (measured: a GEMM-based kernel, 25x
        slower on unet). So both halves run bare into f32, H = f32(2·acc_hi) (weight scale
        2) and T = f32(acc_lo), and a binary primitive finishes: ``H + T`` rounded once
        (= f32(acc)), then the post-ops ws, b, P and the dst scale and zero point
        (``linear(f32(1/s), 0)`` then ``linear(1, zp)``: the same two roundings as the dst
        attributes), stored with rint and saturation — bit for bit what ``apply`` gives.
        Not taken (False) when P holds a residual sum of an 8-bit tensor or a primitive would
        be slow, or a run-time operand (``TensorBinary``) and no ``tensor_slot`` to read it
        from. A float32 residual (sum scale 1, zero point 0: TensorRT-style placement) is
        the finish's ``binary_add`` of that tensor, the same float32 add.
        A convolution takes it too when its main primitive (``main_composed``) would be slow:
        measured on AVX2, a 1x1 convolution over a 1x1 image (a squeeze-excitation FC)
        with the full-tensor binary post-op falls to ``ref:any``. A batch of 1x1 images
        runs the binary primitive over 2-D (N, C) views: oneDNN 3.2's jit binary applies
        per-channel binary post-ops wrongly when N > 1 and every spatial dim is 1
        (docs/onednn.md; tests/runtime/test_onednn_f32.py).
        Returns the slot written (None: not taken): the node's output, or with ``into`` a
        new f32 temporary of that name (unfused mode's accumulator, ``composed`` empty)."""
        if tensor_slot is not None:  # a float32 residual sum: the finish's binary add
            composed = replace(composed, post_ops=[
                TensorBinary("add", op.port) if _float_sum(op) else op
                for op in composed.post_ops])
        operands = Sum if tensor_slot is not None else Sum | TensorBinary
        if (self.halves is None
                or any(isinstance(op, operands) for op in composed.post_ops)
                or self._on_exact_impl(unsplit)):
            return None
        if node.op is not Op.CONV_TRANSPOSE and (
                main_is_slow is None
                or not main_is_slow(self.main_composed(ctx, node, composed, "probe"))):
            return None
        kind = "deconvolution" if node.op is Op.CONV_TRANSPOSE else "convolution"
        y = node.outputs[0]
        yinfo = ctx.info(y)
        ndims = len(yinfo.shape)
        t_md = _lo_layout(ctx, node)
        hi_comp = Composed(composed.channels, DType.F32, wei_scales=np.full(1, 2, F32))
        hi_attr = build_attr(hi_comp, ndims=ndims, channel_axis=channel_axis,
                             wei_mask=wei_mask, dst_type=DataType.f32, src_zp=src_zp)
        hi_pd, hi_wmem = create(hi_attr, t_md, hi_comp, weights=self.halves[0])
        finish = as_float_post_ops(composed)
        flat = single_pixel_batch(yinfo.shape)
        b_md = plain_md(yinfo.shape[:2], DataType.f32) if flat else t_md
        tile = _finish_rows(node, finish, yinfo.shape, flat)
        if tile > 1:  # the channels-last map as rows of ``tile`` pixels, operands tiled
            channels = int(yinfo.shape[1])
            b_md = plain_md((math.prod(yinfo.shape) // (tile * channels), tile * channels),
                            DataType.f32)
            finish = tiled_channels(finish, channels, tile)
        view = flat or tile > 1
        def operand(port: int) -> tuple[str, MemoryDesc]:  # as the (N, C) view when flat
            assert tensor_slot is not None
            slot, md = tensor_slot(port)
            if not flat:
                return slot, md
            view = plain_md(md.dims[:2], md.dtype)
            assert same_bytes(plain_md(md.dims, md.dtype), md)
            return ctx.temp(f"{slot}@flat", view, alias=slot), view

        built = build_attr(finish, ndims=2 if view else ndims,
                           channel_axis=1 if view else channel_axis, wei_mask=wei_mask,
                           dst_type=DataType.f32,
                           tensor_slot=operand if tensor_slot is not None else None)
        dst_md = md_like(b_md, DataType.f32 if into else dnnl_type(yinfo.dtype))
        assert dst_md is not None
        pd = binary(Alg.binary_add, b_md, b_md, dst_md, attr=built.attr)
        h_md = hi_pd.dst_md
        assert h_md is not None
        if (not same_bytes(h_md, t_md) or is_slow(hi_pd.impl_name, kind)
                or pd.impl_name.startswith("ref")):
            return None
        t = self._add_lo(ctx, node, create, t_md, None, channel_axis=channel_axis,
                         wei_mask=wei_mask, src_zp=src_zp, wei_zp=0)
        h = ctx.temp(f"{y}@hi", h_md)
        h_view = h if h_md == b_md else ctx.temp(f"{y}@hi_view", b_md, alias=h)
        if view:
            t = ctx.temp(f"{y}@lo_view", b_md, alias=t)
        assert hi_wmem is not None
        info = KernelInfo(node=node.name, op=node.op.value, note="exact_int8: high half of "
                          f"the split weights of '{node.name}' (no VNNI)")
        kernel = ctx.add_primitive(f"{node.name}:hi", hi_pd,
                                   {int(Arg.SRC): ctx.source(node.inputs[0], hi_pd.src_md),
                                    int(Arg.DST): h, **hi_attr.slot_args},
                                   {**hi_attr.fixed, int(Arg.WEIGHTS): hi_wmem}, info=info)
        ctx.exact_int8[kernel.name] = HIGH_HALF
        info = ctx.info_for(node, optimizations=list(composed.fired), post_ops=built.names,
                            post_op_details=built.details, rounding=composed.rounding())
        whole = md_like(t_md, dst_md.dtype) if view else dst_md
        assert whole is not None
        written = out = ctx.temp(into, whole) if into else ctx.define(y, whole)
        if view:
            out = ctx.temp(f"{y}@view", dst_md, alias=out)
        kernel = ctx.add_primitive(node.name, pd, {int(Arg.SRC_0): h_view, int(Arg.SRC_1): t,
                                                   int(Arg.DST): out, **built.slot_args},
                                   dict(built.fixed), info=info)
        self.how = f"{self.how}, halves added by a binary primitive"
        self.record(ctx, kernel)
        return written

    def _on_exact_impl(self, unsplit: Callable[[], PrimitiveDesc]) -> bool:
        """True (and nothing split) when the unsplit primitive, as created now (after the
        shift of an s8 src), is on an exact implementation: ``ref:any`` accumulates in int32."""
        if self.splits and not self.probed:
            impl = unsplit().impl_name
            if impl_is_exact(impl) and not (self.deconv and "ref:" in impl):
                self.halves = self.runtime = self.pairing = None
                shifted = f"{SHIFT}; " if self.how.startswith(SHIFT) else ""
                self.how = f"{shifted}no split needed ({impl} accumulates in int32)"
        self.probed = True
        return not self.splits

    def _add_lo(self, ctx: LowerContext, node: Node, create: Create, t_md: MemoryDesc,
                runtime: tuple[str, str] | None, *, channel_axis: int, wei_mask: int,
                src_zp: SrcZeroPoint, wei_zp: int,
                excess: tuple[np.ndarray, str, MemoryDesc] | None = None,
                addend: str | None = None) -> str:
        """The ``lo`` kernel (no scales, f32 dst T); returns T's slot. ``excess``: weights
        ``e`` of pair-safe weights, read from a slot of the even input channels (its md);
        ``addend``: the slot of another f32 T (laid out as T) the kernel adds (exact while
        both are integers below 2^24, as the main kernel's add of T)."""
        y = node.outputs[0]
        empty, built = self._lo_attr(ctx, node, channel_axis=channel_axis, wei_mask=wei_mask,
                                     src_zp=src_zp, wei_zp=wei_zp, addend=addend)
        if excess is not None:
            pd, wmem = create(built, t_md, empty, weights=excess[0], src_md=excess[2])
            assert pd.src_md == excess[2], (pd.src_md, excess[2])
            src = excess[1]
        else:
            lo = None if self.halves is None else self.halves[1]
            pd, wmem = create(built, t_md, empty, weights=lo)
            src = ctx.source(node.inputs[0], pd.src_md)
        args = {int(Arg.SRC): src, **built.slot_args}
        fixed = dict(built.fixed)
        if runtime is not None:
            args[int(Arg.WEIGHTS)] = ctx.source(runtime[1], pd.weights_md)
        else:
            assert wmem is not None
            fixed[int(Arg.WEIGHTS)] = wmem
        dst_md = pd.dst_md
        assert dst_md is not None
        if dst_md != t_md and same_bytes(dst_md, t_md):  # one layout: a view, not a copy
            acc = ctx.temp(f"{y}@lo_acc", dst_md)
            args[int(Arg.DST)] = acc
            t = ctx.temp(f"{y}@lo", t_md, alias=acc)
        else:
            t = ctx.temp(f"{y}@lo", t_md)
            args[int(Arg.DST)] = t if dst_md == t_md else ctx.temp(f"{y}@lo_acc", dst_md)
        # node named (its time is the node's), no absorbed list: the main kernel absorbs them
        what = EXCESS if excess is not None else LOW_HALF
        info = KernelInfo(node=node.name, op=node.op.value,
                          note=f"exact_int8: {what} of '{node.name}' (no VNNI)")
        kernel = ctx.add_primitive(f"{node.name}:lo", pd, args, fixed, info=info)
        ctx.exact_int8[kernel.name] = what
        if args[int(Arg.DST)] != t and ctx.slots[t].alias != args[int(Arg.DST)]:
            ctx.add_reorder(args[int(Arg.DST)], t, note=f"low half of '{node.name}' laid out "
                            "like its dst")
        return t

    @staticmethod
    def _lo_attr(ctx: LowerContext, node: Node, *, channel_axis: int, wei_mask: int,
                 src_zp: SrcZeroPoint, wei_zp: int, addend: str | None = None
                 ) -> tuple[Composed, BuiltAttr]:
        """The ``lo`` kernel's (empty) chain and attributes: no scales, f32 dst; with an
        ``addend`` (the T of another excess kernel) its binary add."""
        shape = ctx.info(node.outputs[0]).shape
        empty = Composed(shape[channel_axis], DType.F32)
        if addend is not None:
            empty = replace(empty, post_ops=[TensorAdd(  # type: ignore[list-item]
                addend, _lo_layout(ctx, node), f"excess of the excess '{addend}'")])
        return empty, build_attr(empty, ndims=len(shape), channel_axis=channel_axis,
                                 wei_mask=wei_mask, dst_type=DataType.f32, src_zp=src_zp,
                                 wei_zp=wei_zp)

    def record(self, ctx: LowerContext, kernel: Kernel) -> None:
        ctx.exact_int8[kernel.name] = self.how
        note = f"exact_int8: {self.how}"
        kernel.info.add_note(note)


def _finish_rows(node: Node, finish: Composed, shape: tuple[int, ...], flat: bool) -> int:
    """k > 1 when the binary finish of split weights runs over its channels-last map as rows
    of k pixels (``[pixels/k, k·C]``, the per-channel operands tiled k times, ``ir.rows``):
    oneDNN 3.2's jit binary walks a per-channel operand of a channels-last tensor pixel by
    pixel. Measured on PP-OCRv4 det QDQ's ConvTranspose finish (13 post-ops, four per channel,
    [1, 24, 240, 320], 2 threads, AVX2): 4.6 ms as laid out, 1.85 ms in rows of 8 pixels.
    Not with a tensor operand (a residual) nor on a map of one pixel (``flat`` views that)."""
    if (flat or node.op not in (Op.CONV, Op.CONV_TRANSPOSE) or len(shape) < 3
            or math.prod(shape[2:]) == 1
            or any(isinstance(op, (TensorBinary, Sum)) for op in finish.post_ops)):
        return 1
    channels = int(shape[1])
    return repeats(math.prod(shape) // channels, channels)


def _lo_layout(ctx: LowerContext, node: Node) -> MemoryDesc:
    """f32 layout of the low half: the one oneDNN's int8 kernels pick for the main primitive's
    dst (channels-last for (de)convolutions, row-major for matmul). Taking a plain nchw
    residual's layout instead (dst forced there for an in-place sum) put the main primitive
    on ``ref:any`` (measured); with channels-last, the layout candidates of context.py take a
    channels-last dst and copy the residual in. Also on a single pixel, whose strides the
    jit kernels compare as they are: ``abcd`` ones there put the main primitive on
    ``ref:any`` (measured, AVX2: a one-row matmul as a 1x1 convolution)."""
    shape = ctx.info(node.outputs[0]).shape
    if node.op in (Op.CONV, Op.CONV_TRANSPOSE):
        return channels_last(shape, DataType.f32)
    return plain_md(shape, DataType.f32)


def _leading_pairs(e: np.ndarray, axis: int) -> np.ndarray:
    """The excess ``e`` (even channels of complete pairs) cut after the last pair holding
    one: where passes/pair_channels.py put those pairs first, the excess kernel reads only
    them (a prefix of the even channels). Grouped weights keep every group's channels."""
    if axis != 1:
        return e
    held = _pairs_held(e, axis)
    return e[:, :held[-1] + 1] if len(held) else e


def _widened(e: np.ndarray, count: int) -> np.ndarray:
    """``e`` with zero channels (dim 1) up to ``count`` when it has fewer."""
    if e.shape[1] >= count:
        return e
    wide = np.zeros((e.shape[0], count, *e.shape[2:]), e.dtype)
    wide[:, :e.shape[1]] = e
    return wide


def _pairs_held(e: np.ndarray, axis: int) -> np.ndarray:
    """The indices of the pairs of input channels (dim ``axis`` of ``e``) holding an excess."""
    return np.flatnonzero(np.moveaxis(e, axis, 0).reshape(e.shape[axis], -1).any(1))


def _to_shared_copy(ctx: LowerContext, slot: str, e: np.ndarray, half: int,
                    value: str) -> np.ndarray:
    """``e`` widened with zero channels to the copy of ``slot``'s even channels that every
    reader can share: the shortest one another reader already made that covers it, else as
    long as the longest prefix the value's other one-group int8 convolutions need (one copy
    kernel for a few more MACs: GoogLeNet's inception branches read one tensor with
    different prefixes, 10 copies more)."""
    count = next((c for c in range(e.shape[1], half + 1)
                  if _even_name(slot, None if c == half else c) in ctx.home), None)
    if count is None:
        count = max([e.shape[1], *(_prefix(ctx.graph, reader) for reader, port
                                   in ctx.graph.consumers(value) if port == 0)])
    if count == e.shape[1] or count > half:
        return e
    return _widened(e, count)


def _prefix(graph: Graph, node: Node) -> int:
    """How many leading pairs of input channels hold an excess in ``node``'s pair-safe
    weights, when it is a one-group int8 convolution with constant weights (else 0)."""
    w = pairing_weights(graph, node)
    if w is None:
        return 0
    split = pair_split(w)
    return 0 if split is None or split[1] is None else _leading_pairs(split[1], 1).shape[1]


def _even_name(slot: str, count: int | None = None) -> str:
    """The even channels' copy of ``slot``; ``count``: only the first ``count`` of them."""
    return f"{slot}@even" if count is None else f"{slot}@even{count}"


def _even_views(md: MemoryDesc, count: int | None = None
                ) -> tuple[MemoryDesc, MemoryDesc] | None:
    """The even channels 0, 2, …, 2·(⌊C/2⌋ − 1) of a tensor laid out as ``md`` (the first
    ``count`` of them when given): a strided view of them and a dense channels-last md of
    their copy; None when ``md`` is blocked or oneDNN would call the view overlapping."""
    strides = md.strides
    half = md.dims[1] // 2
    dims = (md.dims[0], half if count is None else min(count, half), *md.dims[2:])
    if (strides is None or md.inner_blocks or len(dims) < 3
            or any(st < 2 * strides[1] * dims[1]
                   for d, st in zip(dims, strides) if st > strides[1] and d > 1)):
        return None
    view = MemoryDesc.from_strides(dims, md.dtype, (strides[0], 2 * strides[1], *strides[2:]))
    return view, channels_last(dims, md.dtype)


def even_channels(ctx: LowerContext, slot: str, views: tuple[MemoryDesc, MemoryDesc],
                  count: int | None = None) -> str:
    """The slot of a dense copy of the even channels of the tensor in ``slot`` (the first
    ``count``: ``_even_views``): one reorder of the strided view, shared by every reader."""
    name = _even_name(slot, count)
    if name not in ctx.home:
        copy = ctx.temp(name, views[1])
        ctx.add_reorder(ctx.temp(f"{name}_view", views[0], alias=slot), copy, role="op",
                        note="exact_int8: the even input channels, for the excess of pair-safe "
                             "weights")
        ctx.home[name] = copy
    return ctx.home[name]


# ------------------------------------------------------------------------- decisions
def for_conv(ctx: LowerContext, node: Node, w: np.ndarray, src: DType,
             group: int) -> Exactness | None:
    """None with ``Options.exact_int8`` off; else how ``node`` stays exact should the
    implementation oneDNN picks not be (``Exactness.needed``). ``w``: oneDNN's logical
    weights ([G,] O, I, k…)."""
    if not ctx.options.exact_int8:
        return None
    shift = src == DType.S8
    depthwise = (node.op is Op.CONV and group > 1 and w.ndim >= 3 and w.shape[1] == 1
                 and w.shape[2] == 1)
    deconv = node.op is Op.CONV_TRANSPOSE
    if depthwise or within_safe_range(w):
        why = "depthwise: int32 products" if depthwise else "weights within [-64, 64]"
        return Exactness(f"{SHIFT}; {why}" if shift else f"no split needed ({why})",
                         shift_src=shift, deconv=deconv)
    # grouped: each group's even channels are the source's when its channel count is even;
    # measured faster than the halves from 16 channels a group (8: 1.02-1.09x slower)
    axis = 1 if group == 1 else 2
    pairing = ((w, axis) if node.op is Op.CONV and w.ndim >= 3 + (axis - 1)
               and (group == 1 or (w.shape[2] >= MIN_GROUP_CHANNELS and w.shape[2] % 2 == 0))
               else None)
    return Exactness(f"{SHIFT}, {SPLIT}" if shift else SPLIT, shift_src=shift,
                     halves=split_weights(w), deconv=deconv, pairing=pairing)


def for_matmul(ctx: LowerContext, node: Node, wei: np.ndarray | None,
               runtime: str | None) -> Exactness | None:
    """As ``for_conv``; runtime (s8) weights are split at run time by two small kernels."""
    if not ctx.options.exact_int8:
        return None
    if wei is not None:
        if within_safe_range(wei):
            return Exactness("no split needed (weights within [-64, 64])")
        return Exactness(SPLIT, halves=split_weights(wei))
    assert runtime is not None
    return Exactness(f"{SPLIT}, at run time", runtime=runtime)


def _split_runtime(ctx: LowerContext, value: str) -> tuple[str, str]:
    """Slots of ``hi = rint(w/2)`` (reorder, scale 0.5) and ``lo = w − 2·hi`` (binary sub,
    src1 scale 2) of an s8 runtime weights tensor, in its layout."""
    hi, lo = f"{value}@hi", f"{value}@lo"
    if hi in ctx.home:
        return hi, lo
    src = ctx.home_slot(value)
    md = ctx.slots[src].md
    hi_slot, lo_slot = ctx.temp(hi, md), ctx.temp(lo, md)
    ctx.add_reorder(src, hi_slot, attr=PrimitiveAttr().set_scales_mask(Arg.SRC, 0),
                    fixed={Arg.scales(Arg.SRC): Memory.scales(0.5)}, role="op",
                    note=f"exact_int8: high half rint(w/2) of runtime weights '{value}'")
    attr = PrimitiveAttr().set_scales_mask(Arg.SRC_1, 0)
    pd = binary(Alg.binary_sub, md, md, md, attr=attr)
    ctx.add_primitive(f"{value}:lo", pd, {int(Arg.SRC_0): src, int(Arg.SRC_1): hi_slot,
                                          int(Arg.DST): lo_slot},
                      {Arg.scales(Arg.SRC_1): Memory.scales(2.0)},
                      info=ctx.info_for(None, note="exact_int8: low half w - 2·hi of runtime "
                                        f"weights '{value}'"))
    ctx.home[hi], ctx.home[lo] = hi_slot, lo_slot
    return hi, lo


def unsigned_source(ctx: LowerContext, node: Node, src_zp: int) -> tuple[Node, int]:
    """``node`` reading its s8 src shifted to u8 (``x + 128``, one reorder shared by every
    reader), and the src zero point that goes with it."""
    clone = Node(node.name, node.op, node.attrs, [shifted(ctx, node.inputs[0]),
                                                  *node.inputs[1:]],
                 list(node.outputs), list(node.origin), node.meta, node.fused)
    return clone, src_zp + 128


def shifted(ctx: LowerContext, x: str, why: str = f"exact_int8: {SHIFT}") -> str:
    """The value ``x + 128`` (u8) of an s8 value ``x``: one reorder, shared by every reader."""
    name = f"{x}@u8"
    if name not in ctx.home:
        md = ctx.md_of(x)
        slot = ctx.temp(name, md_like(md, DataType.u8) or plain_md(md.dims, DataType.u8))
        ctx.add_reorder(ctx.home_slot(x), slot,
                        attr=PrimitiveAttr().set_zero_points_mask(Arg.DST, 0),
                        fixed={Arg.zero_points(Arg.DST): Memory.zero_points(128)}, role="op",
                        note=f"{why}: '{x}' + 128")
        ctx.home[name] = slot
    return name


def isa_notes(ctx: LowerContext, int8: bool) -> dict[str, Any]:
    """The plan's notes: the ISA, whether its dot products are exact, what was done here
    (per kernel: an int8 kernel absent from ``exact_int8`` runs on an exact implementation)."""
    isa = effective_cpu_isa()
    exact = isa in EXACT_INT8_ISAS
    if int8 and not exact and not ctx.options.exact_int8:
        log.warning("oneDNN runs on %s, which has no VNNI, and exact_int8 is off: int8 "
                    "products are summed in pairs with int16 saturation, so accumulators can "
                    "differ from the exact sum (weights within [-64, 64] avoid it)", isa.name)
    elif int8 and ctx.exact_int8:
        split = sum(SPLIT in how for how in ctx.exact_int8.values())
        log.info("oneDNN runs on %s: %d int8 kernel(s) split for exact accumulators (their "
                 "implementations have no VNNI)", isa.name, split)
    return {"cpu_isa": isa.name, "exact_int8_dot_products": exact,
            "exact_int8": dict(ctx.exact_int8)}
