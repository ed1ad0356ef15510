"""integer_requantize: shorter post-ops where a chain runs on a few hundred integers.

quantize_static puts a QuantizeLinear / DequantizeLinear pair after nearly every op, so a fused
chain is a row of requantizations (PP-OCRv4 rec QDQ, a convolution and its learnable affine):

    … ÷s₁ round clip(−155, 100)  ·s₁ ÷s₁ round clip(−155, 100)  ·s₁+β ÷s₂ round clip(−167, 88) ·s₂

Each ``÷s`` is a binary_div post-op and each ``·s`` an eltwise linear, and in oneDNN's jit
kernels each post-op costs about the same (measured on a 230400-element jit binary, AVX2, two
threads: linear 11.6 µs, binary_div 12.8, clip 4.7, round 2.4): a gate of 21 post-ops takes
151 µs, the convolution itself under it ~17 µs per requantization.

After ``round`` and ``clip(lo, hi)`` with integer bounds the value is one of the integers
lo…hi (or −0): oneDNN's clip maps NaN to lo (measured, jit:uni) and ±inf to a bound. Until the
next post-op that reads something other than constants (a run-time tensor, a sum), the chain
is a function of that integer and of the channel. So a rewrite of that stretch can be checked
on every (integer, channel) it can see, and it is kept only where it gives the same float32
bits for all of them — or, where the stretch ends at an integer store, the same stored
integer — both with eltwise linear as one fused multiply-add (oneDNN's jit kernels,
runtime/reference/chain.apply_composed) and as a multiply then an add (its reference
kernels). The rewrites tried, until none applies:

- a requantization that gives its input back, ``·s ÷s round clip``: removed (four post-ops);
- a run of multiplies, divides and adds by constants (eltwise linear, per-tensor or
  per-channel binary post-ops) as ``x·α + β`` in fewer post-ops: ``linear(α, β)`` when α and
  β are one value each (a dequantize and the next quantize's division: ``linear(a/s, b/s)``),
  else a per-channel multiply and / or add (ConvNeXt's layer scale γ between a dequantize and
  a quantize: ``·s₁ ·γ ÷s₂`` as one multiply by s₁·γ/s₂), each constant rounded to float32
  once; the whole run first, then each neighbouring pair;
- a ``round`` whose input is already an integer: removed; one after an add, or a linear with
  an integer slope, whose offset is not (a dequantize, an added constant, then the next
  quantize of the same scale: ``linear(1, 0.718) round``): removed with the offset rounded,
  ``linear(1, 1)``, which the affine rewrite then merges with its neighbours;
- a ``clip`` that never binds: removed.

The result is bit-identical to the chain before (that is the check), so it changes no number
anywhere; the ONNX rounding form the kernel stands for (``Composed.rounding``) is recorded
before, as the division it computes exactly. Only stretches after an integer point are
touched: the first quantization of a convolution's output sees any float32 and keeps its
division.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from qfuse.ir.postops import Binary, Composed, Eltwise, PostOp
from qfuse.ir.types import DType
from qfuse.runtime.reference.chain import apply_composed

F32 = np.float32
MAX_DOMAIN = 1 << 16  # integers a stretch may see before it is not worth checking
MAX_GRID = 1 << 20  # integers times channels checked at most (a few ms of numpy a rewrite)


def simplify(composed: Composed) -> bool:
    """Rewrite ``composed.post_ops`` in place (module docstring); True when something changed."""
    ops = list(composed.post_ops)
    channels = composed.channels
    changed = False
    i = 0
    while i < len(ops):
        domain = _integers_after(ops, i)
        if domain is None:
            i += 1
            continue
        end = i
        while end < len(ops) and _in_stretch(ops[end], channels):
            end += 1
        store = composed if end == len(ops) else None
        stretch = _shorten(ops[i:end], _grid(ops[i:end], domain, channels), store)
        if len(stretch) < end - i:
            ops[i:end] = stretch
            changed = True
        i += max(len(stretch), 1)
    if changed:
        if composed.form is None:
            composed.form = composed.rounding()
        composed.post_ops = ops
    return changed


def _in_stretch(op: PostOp, channels: int) -> bool:
    """A post-op whose only operand (if any) is a constant, one value or one per channel."""
    if isinstance(op, Eltwise):
        return op.alg in ("linear", "round", "clip")
    return isinstance(op, Binary) and op.values.size in (1, channels) and op.alg in (
        "add", "mul", "div", "max", "min")


def _grid(stretch: list[PostOp], domain: np.ndarray, channels: int) -> np.ndarray | None:
    """The values to check the stretch on: the integers, one row per channel when a post-op
    of the stretch holds per-channel constants (None when that grid is too large to check)."""
    rows = channels if any(isinstance(op, Binary) and op.values.size > 1
                           for op in stretch) else 1
    if rows * domain.size > MAX_GRID:
        return None
    return np.ascontiguousarray(np.broadcast_to(domain, (rows, domain.size)))


def _integers_after(ops: list[PostOp], i: int) -> np.ndarray | None:
    """The float32 values the chain can hold before ``ops[i]`` when ``round`` then an integral
    ``clip`` precede it: lo…hi, and −0 when 0 is among them."""
    if i < 2:
        return None
    rnd, clip = ops[i - 2], ops[i - 1]
    if not (isinstance(rnd, Eltwise) and rnd.alg == "round"
            and isinstance(clip, Eltwise) and clip.alg == "clip"):
        return None
    lo, hi = F32(clip.alpha), F32(clip.beta)
    if not (np.isfinite(lo) and np.isfinite(hi) and lo <= hi and lo == np.rint(lo)
            and hi == np.rint(hi) and hi - lo < MAX_DOMAIN):
        return None
    values = np.arange(lo, hi + 1, dtype=np.float64).astype(F32)
    if lo <= 0 <= hi:
        values = np.append(values, F32(-0.0))
    return values


def _shorten(stretch: list[PostOp], domain: np.ndarray | None,
             store: Composed | None) -> list[PostOp]:
    """The shortest stretch the rewrites reach that computes what ``stretch`` does on
    ``domain`` (rows: channels)."""
    if domain is None or len(stretch) < 2:
        return stretch
    want = [_run(stretch, domain, store, fused) for fused in (True, False)]
    current = list(stretch)
    progress = True
    while progress:
        progress = False
        for candidate in _candidates(current):
            if all(_same(_run(candidate, domain, store, fused), w, store)
                   for fused, w in zip((True, False), want, strict=True)):
                current = candidate
                progress = True
                break
    return current


def _candidates(ops: list[PostOp]) -> Iterator[list[PostOp]]:
    """Each rewrite of the module docstring at each place it fits, most saved first."""
    for j in range(len(ops) - 3):
        a, d, r, c = ops[j:j + 4]
        if (_linear(a) and _divide(d) and isinstance(r, Eltwise) and r.alg == "round"
                and isinstance(c, Eltwise) and c.alg == "clip"):
            yield ops[:j] + ops[j + 4:]
    runs = _affine_runs(ops)
    pairs = [(i, i + 2) for start, end in runs if end - start > 2 for i in range(start, end - 1)]
    for j, k in [*runs, *pairs]:
        merged = _affine_form(ops[j:k])
        if merged is not None:
            yield ops[:j] + merged + ops[k:]
    for j, op in enumerate(ops):
        if isinstance(op, Eltwise) and op.alg == "round":
            yield ops[:j] + ops[j + 1:]
            shifted = _integer_offset(ops[j - 1]) if j else None
            if shifted is not None:
                yield ops[:j - 1] + [shifted] + ops[j + 1:]
    for j, op in enumerate(ops):
        if isinstance(op, Eltwise) and op.alg == "clip":
            yield ops[:j] + ops[j + 1:]


def _integer_offset(op: PostOp) -> PostOp | None:
    """``op`` (an add, or a linear with an integer slope) with its offsets rounded to integers:
    on an integer it then gives what ``op`` and a ``round`` give, unless an offset sits at a
    half (the check decides)."""
    if isinstance(op, Eltwise) and op.alg == "linear" and F32(op.alpha) == np.rint(F32(op.alpha)):
        return Eltwise("linear", op.alpha, float(np.rint(F32(op.beta))))
    if isinstance(op, Binary) and op.alg == "add":
        return Binary("add", np.rint(np.asarray(op.values, F32)))
    return None


def _linear(op: PostOp) -> bool:
    return isinstance(op, Eltwise) and op.alg == "linear"


def _divide(op: PostOp) -> bool:
    return isinstance(op, Binary) and op.alg == "div"


def _affine(op: PostOp) -> bool:
    return _linear(op) or (isinstance(op, Binary) and op.alg in ("add", "mul", "div"))


def _affine_runs(ops: list[PostOp]) -> list[tuple[int, int]]:
    """[start, end) of each maximal run of two or more affine post-ops (linear, add, mul,
    divide by constants)."""
    runs, j = [], 0
    while j < len(ops):
        k = j
        while k < len(ops) and _affine(ops[k]):
            k += 1
        if k - j >= 2:
            runs.append((j, k))
        j = max(k, j + 1)
    return runs


def _affine_form(run: list[PostOp]) -> list[PostOp] | None:
    """``run`` as x·α + β (per channel, each constant rounded to float32 once), written in
    fewer post-ops than it has: linear(α, β) when α and β are one value each, else a
    multiply and / or an add by per-channel constants; None when it takes as many."""
    alpha, beta = np.ones(1), np.zeros(1)
    for op in run:
        if isinstance(op, Eltwise):
            a, b = np.float64(F32(op.alpha)), np.float64(F32(op.beta))
            alpha, beta = alpha * a, beta * a + b
            continue
        assert isinstance(op, Binary)
        v = op.values.reshape(-1).astype(F32).astype(np.float64)
        if op.alg == "add":
            beta = beta + v
        elif op.alg == "mul":
            alpha, beta = alpha * v, beta * v
        elif np.all(v != 0):
            alpha, beta = alpha / v, beta / v
        else:
            return None
    a32, b32 = alpha.astype(F32), beta.astype(F32)
    if not (np.all(np.isfinite(a32)) and np.all(np.isfinite(b32))):
        return None
    one_a, one_b = np.unique(a32).size == 1, np.unique(b32).size == 1
    if one_a and one_b:
        form: list[PostOp] = [Eltwise("linear", float(a32[0]), float(b32[0]))]
    elif not np.any(b32):
        form = [Binary("mul", a32)]
    elif np.all(a32 == 1):
        form = [Binary("add", b32)]
    elif one_a:
        form = [Eltwise("linear", float(a32[0]), 0.0), Binary("add", b32)]
    else:
        form = [Binary("mul", a32), Binary("add", b32)]
    return form if len(form) < len(run) else None


def _run(ops: list[PostOp], grid: np.ndarray, store: Composed | None,
         fused: bool) -> np.ndarray:
    """The stretch on ``grid`` (rows: channels) as oneDNN computes it
    (runtime/reference/chain.apply_composed), then the integer store when it ends the chain.
    ``fused``: eltwise linear as one rounding (jit), else a multiply then an add (reference)."""
    if not fused:
        ops = [step for op in ops for step in _two_roundings(op)]
    model = Composed(grid.shape[0], store.dst_dtype if store is not None else DType.F32,
                     post_ops=ops, dst_scale=store.dst_scale if store is not None else None,
                     dst_zero_point=store.dst_zero_point if store is not None else 0)
    with np.errstate(all="ignore"):
        return apply_composed(grid, model, {}, channel_axis=0)


def _two_roundings(op: PostOp) -> list[PostOp]:
    """``linear(a, b)`` as oneDNN's reference kernels compute it: ``x·a``, rounded, ``+ b``."""
    if isinstance(op, Eltwise) and op.alg == "linear":
        return [Binary("mul", np.array([op.alpha], F32)), Binary("add", np.array([op.beta], F32))]
    return [op]


def _same(got: np.ndarray, want: np.ndarray, store: Composed | None) -> bool:
    """Bit for bit; a stored integer is a value (−0 and +0 store alike)."""
    if store is not None and store.dst_dtype.is_integer:
        return bool(np.array_equal(got, want))
    return bool(np.array_equal(got.view(np.uint32), want.view(np.uint32)))
