"""DnnlPostOpsComposer (OpenVINO fake_quantize.md): a post-op chain → oneDNN 3.x attributes.

oneDNN 3.x computes (docs/onednn.md)

    x   = f32(acc)·wei_scale[oc] + bias[oc]          (bias is added after the scale)
    x   = post_op_n(… post_op_0(x))                    (eltwise / sum / binary / prelu)
    dst = saturate(rint(x·f32(1/dst_scale)) + dst_zp)  (integer dst), or x (f32 dst)

The composer first lowers the chain (ir/chain.py) to basic operations — multiply, add, round,
clip (each per tensor or per channel), eltwise, sum, prelu — then maps them one by one onto
those slots. Each optimization below has a name, states the identity it relies on and the
precondition that makes it true, can be switched off in ``ComposerOptions``, and is recorded in
``Composed.fired`` when it applies. A step either applies whole or leaves the state untouched
(check before changing).

Identities used (exact in real arithmetic; in float32 a folded constant such as a·b is
rounded once instead of the product being rounded twice, which moves results by at most one
quantization step, and rarely):

- skip_identity:         x·1 = x, x+0 = x.
- quantize_clip_after_round (OpenVINO fake_quantize.md): for ih > il, with isc = (L-1)/(ih-il), ish = -il·isc,
  round(clip(x, il, ih)·isc + ish) = clip(round(x·isc + ish), 0, L-1), because x ↦ x·isc+ish
  is increasing and maps [il, ih] onto [0, L-1] whose ends are integers. A per-channel crop
  becomes a per-tensor one.
- fold_output_shift (OpenVINO fake_quantize.md): when the FakeQuantize output scale is 1 and its output shift
  k = ol is an even integer, round(y) + k = round(y + k) — with round half to even this needs
  k even (rint(2.5) + 1 = 3 but rint(3.5) = 4); qmin is 0 or -128, so a quantize-only
  FakeQuantize always qualifies — and k joins the input shift and the clip bounds move by k.
- onnx_quantize (how a Quantize from an ONNX Q/DQ pair lowers; not an option): ONNX rounds
  first and adds the zero point after, q = clip(round(x·(1/s)) + zp, qmin, qmax), so the chain
  becomes multiply, round, add zp, clip. oneDNN's store adds its dst zero point *before*
  rounding, rint(x·(1/s) + zp), which is a different function: float32 rounding of x/s + zp
  moves values within an ulp of a tie, and on exact ties rint(2.5) + 1 ≠ rint(3.5). With the
  round as an eltwise_round post-op, the store's rint(r + zp) of an integer r is exact.
- onnx_divide: an ONNX quantization divides, x/s (binary_div post-op), as ONNX QuantizeLinear
  and onnxruntime do; x·f32(1/s) — which folds into the weight scales or an eltwise linear for
  free — is a different float32 function that puts values within an ulp of a tie, and exact
  ties (a sum or product of dequantized values, an integer average, often land on one) on
  the other side. Off: the multiply, folded (what qfuse did before; docs/numerics.md).
- clip_shift: an inner quantize-dequantize round(y) + zp → clip(lo, hi) → − zp (ONNX Q → DQ)
  is clip(round(y), lo − zp, hi − zp): exact, since round(y) + zp and the clip are integers,
  and it leaves the dequantization's ·s alone, so (q − zp)·s is one float32 rounding as in
  DequantizeLinear instead of fold_into_linear's q·s − zp·s (two roundings, one fused).
- zero_point_before_round (off by default): the old shortcut round(y) + zp = round(y + zp)
  (exact in real arithmetic for an even zp off ties only) — the store takes the scale and the
  zero point and the eltwise_round disappears; measured, not assumed (docs/numerics.md).
- drop_round_clip: the last round and a clip whose range covers the dst type's range are what
  oneDNN's store already does (rint + saturate), so they are dropped; in the ONNX form a
  covering clip after round(y) + zp is dropped alone (the store's rint of an integer is
  exact, its saturation is the clip).
- dst_zero_point / dst_scale: a trailing per-tensor  ·v  then  +z  (z integer) before the store
  are the dst scale 1/v and dst zero point z (when ·v is a quantize with a known scale s, the
  dst scale is s itself, as the model states it).
- mul_to_weight_scales: first multiply before any post-op: acc·w·v = acc·(w·v); with a bias
  already set, (acc·w + b)·v = acc·(w·v) + b·v.
- scale_past_bias (off by default): mul_to_weight_scales and relu_mul_swap for a per-tensor
  multiply after the bias, (acc·w + b)·v = acc·(w·v) + b·v. Off, that multiply stays after
  the bias (an eltwise linear, which a following per-tensor add joins by fold_into_linear),
  so the kernel rounds the conv-plus-bias and then the multiply, in the model's order, as
  the reference does (an affine block after a conv: conv → ·a → +b). Measured on the real
  zoo (docs/numerics.md, "Multiply after the bias"): 12 of 15 plans change (also the x·(1/s)
  of a gate's inner quantization after its bias), the results only on the two PP-OCR NNCF
  models: folded, one recurring near-tie value of one backbone conv each made them differ
  from exact QDQ on 18 and 8 values over 8 inputs, unfolded on 2 and 2 (the det one then on
  float64's side everywhere). A per-channel multiply still folds (as a binary post-op it
  would read a vector per element).
- add_to_bias: an add before any post-op goes into the bias: acc·w + b + a.
- relu_mul_swap: relu(x)·s = relu(x·s) when every s > 0 (OpenVINO applies it without checking
  the sign; a negative s makes it wrong, so here it is checked).
- sum_scale: (x + t·(d - zp))·s = x·s + (t·s)·(d - zp), per-tensor s, when the sum is the only
  post-op so far.
- fold_into_linear: linear(a, b)·s = linear(a·s, b·s) and linear(a, b) + c = linear(a, b + c),
  per-tensor s and c.
- per_tensor_eltwise: per-tensor multiply / add / clip as eltwise linear / clip (binary
  post-ops are slower than eltwise).
- uniform_values: a per-channel operand whose values are all the same float32 bits (the
  +128 of a signed per-channel quantization moved to u8, NNCF's per-channel quantizers of
  depthwise inputs) is applied as that one value where the float32 function is the same: a
  multiply, add or clip left as a post-op becomes the eltwise linear / clip, and the store
  takes the trailing clip and zero point (a binary operand of one value is already a scalar
  one: compiler/lower/attrs.post_op_operand). The folds above still
  see it as per-channel, so no rounding moves (a per-tensor add would join a linear by
  fold_into_linear, two roundings made one).
- exact dequantize (not an option): the multiply of a dequantize marked ``exact`` (a graph
  output's DequantizeLinear the kernel writes as float32) is never folded: after the round,
  + zp and clip, (q - zp) is an integer, linear(1, -zp) keeps it exactly and linear(s, 0)
  rounds (q - zp)·s once — what the standalone DequantizeLinear computes — where a folded
  linear(s, -zp·s) would round s·q - f32(zp·s) instead.
- integer_requantize (passes/integer_requantize.py, applied by compose_post_ops to the
  final mapping, not while fuse_post_ops tries chains): after round and an integral clip the
  value is one of a few hundred integers, so the post-ops up to the next one reading a
  tensor are shortened where every one of those integers gives the same float32 bits.
- drop_inner_round (off by default; OpenVINO fake_quantize.md's "existing implementation" shortcut): a round
  that is not the last one and is followed by a residual sum is dropped — this changes results
  (it removes one quantization of the residual branch) and is measured, not assumed.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from qfuse.ir.chain import (
    Activation,
    ChainOp,
    PRelu,
    Quantize,
    Residual,
    Scale,
    Shift,
    TensorOperand,
)
from qfuse.ir.postops import (
    ACT_ALG,
    Add,
    Basic,
    Binary,
    Clip,
    Composed,
    ComposerOptions,
    Div,
    Eltwise,
    Mul,
    Prelu,
    Round,
    Sum,
    TensorBinary,
    one_value,
)
from qfuse.ir.types import DType


class ComposeError(ValueError):
    """The chain cannot be expressed with oneDNN attributes."""


def _f32(values: object) -> np.ndarray:
    return np.atleast_1d(np.asarray(values, dtype=np.float64)).astype(np.float32)


def _single(values: np.ndarray, options: ComposerOptions) -> bool:
    """One value for every channel: per tensor, or (uniform_values) per channel with the
    same float32 bits everywhere (ir.postops.one_value)."""
    return values.size == 1 or (options.on("uniform_values") and one_value(values))


def _single_clip(clip: Clip, options: ComposerOptions) -> bool:
    return _single(clip.lo, options) and _single(clip.hi, options)


def _note_uniform(out: Composed, *arrays: np.ndarray) -> None:
    if any(a.size > 1 for a in arrays):
        out.fired.append("uniform_values")



# ---------------------------------------------------------------------- lowering
def to_basic(chain: list[ChainOp], options: ComposerOptions, fired: list[str]) -> list[Basic]:
    """Chain items → basic operations (FakeQuantize per OpenVINO fake_quantize.md's decomposition)."""
    basic: list[Basic] = []
    for item in chain:
        if isinstance(item, Scale):
            basic.append(Mul(_f32(item.values), exact=item.exact))
        elif isinstance(item, Shift):
            basic.append(Add(_f32(item.values)))
        elif isinstance(item, Activation):
            basic.append(Eltwise(ACT_ALG[item.act], item.alpha, item.beta))
        elif isinstance(item, PRelu):
            basic.append(Prelu(_f32(item.slopes)))
        elif isinstance(item, Residual):
            basic.append(Sum(item.scale, item.zero_point, item.dtype, item.port))
        elif isinstance(item, Quantize) and item.onnx is not None:
            basic.extend(_onnx_quantize_to_basic(item, options, fired))
        elif isinstance(item, Quantize):
            basic.extend(_quantize_to_basic(item, options, fired))
        elif isinstance(item, TensorOperand):
            basic.append(TensorBinary(item.alg, item.port))
        else:  # pragma: no cover - the chain type is closed
            raise ComposeError(f"unknown chain item {item!r}")
    if options.on("clip_shift"):
        basic = _clip_shift(basic, fired)
    return basic


def _clip_shift(basic: list[Basic], fired: list[str]) -> list[Basic]:
    """round, +z, clip(lo, hi), −z  →  round, clip(lo − z, hi − z) (module docstring)."""
    out: list[Basic] = []
    i = 0
    while i < len(basic):
        window = basic[i:i + 4]
        if (len(window) == 4 and isinstance(window[0], Round) and isinstance(window[1], Add)
                and isinstance(window[2], Clip) and isinstance(window[3], Add)):
            z, clip, back = window[1].values, window[2], window[3].values
            if (z.shape == back.shape and np.array_equal(z, -back)
                    and np.all(np.mod(z, 1) == 0)):
                out += [window[0], Clip(_f32(clip.lo - z), _f32(clip.hi - z))]
                fired.append("clip_shift")
                i += 4
                continue
        out.append(basic[i])
        i += 1
    return out


def _onnx_quantize_to_basic(q: Quantize, options: ComposerOptions,
                            fired: list[str]) -> list[Basic]:
    """ONNX's clip(round(x/s) + zp, qmin, qmax) (module docstring, onnx_quantize)."""
    assert q.onnx is not None
    quant = q.onnx.quant
    scale = quant.scale_array().astype(np.float64)
    zp = quant.zero_point_array().astype(np.float64)
    lo, hi = q.onnx.dtype.range
    known = float(scale[0]) if scale.size == 1 else None
    mul: Mul | Div = Mul(_f32(1.0 / scale), inverse_of=known)
    if options.on("onnx_divide") and not options.on("zero_point_before_round"):
        fired.append("onnx_divide")
        mul = Div(_f32(scale))
    clip = Clip(_f32(lo), _f32(hi))
    if not np.any(zp):
        return [mul, Round(), clip]
    if options.on("zero_point_before_round"):
        fired.append("zero_point_before_round")
        return [mul, Add(_f32(zp)), Round(), clip]
    fired.append("onnx_quantize")
    return [mul, Round(), Add(_f32(zp)), clip]


def _quantize_to_basic(q: Quantize, options: ComposerOptions, fired: list[str]) -> list[Basic]:
    il, ih = np.asarray(q.input_low, np.float64), np.asarray(q.input_high, np.float64)
    ol, oh = np.asarray(q.output_low, np.float64), np.asarray(q.output_high, np.float64)
    steps = q.levels - 1
    if np.any(ih == il):
        raise ComposeError("FakeQuantize with input_low == input_high has no scale")
    isc = steps / (ih - il)
    ish = -il * isc
    osc = (oh - ol) / steps
    if options.on("quantize_clip_after_round") and np.all(ih > il):
        fired.append("quantize_clip_after_round")
        lo, hi = np.zeros(1), np.full(1, float(steps))
        known = q.scale if q.scale is not None and isc.size == 1 else None
        ops: list[Basic] = [Mul(_f32(isc), inverse_of=known), Add(_f32(ish)), Round()]
        single_ol = np.unique(ol).size == 1
        if (options.on("fold_output_shift") and np.all(osc == 1.0) and single_ol
                and float(ol.flat[0]).is_integer() and float(ol.flat[0]) % 2 == 0):
            fired.append("fold_output_shift")
            k = float(ol.flat[0])
            ops[1] = Add(_f32(ish + k))
            return [*ops, Clip(_f32(lo + k), _f32(hi + k))]
        return [*ops, Clip(_f32(lo), _f32(hi)), Mul(_f32(osc)), Add(_f32(ol))]
    lo, hi = np.minimum(il, ih), np.maximum(il, ih)
    return [Clip(_f32(lo), _f32(hi)), Mul(_f32(isc)), Add(_f32(ish)), Round(),
            Mul(_f32(osc)), Add(_f32(ol))]


# ---------------------------------------------------------------------- composing
def compose(
    chain: list[ChainOp],
    *,
    channels: int,
    dst_dtype: DType,
    options: ComposerOptions | None = None,
) -> Composed:
    """Map ``chain`` onto oneDNN attributes for a primitive with ``channels`` outputs."""
    options = options or ComposerOptions()
    out = Composed(channels, dst_dtype)
    basic = to_basic(chain, options, out.fired)
    for op in basic:
        for values in _values_of(op):
            if values.size not in (1, channels):
                raise ComposeError(f"{type(op).__name__} has {values.size} values for "
                                   f"{channels} channels")
    if options.on("drop_inner_round"):
        basic = _drop_inner_rounds(basic, out.fired)
    if dst_dtype.is_integer:
        basic = _take_store(basic, dst_dtype, options, out)
    for op in basic:
        _append(out, op, options)
    if sum(isinstance(p, Sum) for p in out.post_ops) > 1:
        raise ComposeError("oneDNN allows one sum post-op; the chain has more residual adds")
    return out


def _values_of(op: Basic) -> list[np.ndarray]:
    if isinstance(op, Mul | Div | Add):
        return [op.values]
    if isinstance(op, Clip):
        return [op.lo, op.hi]
    if isinstance(op, Prelu):
        return [op.slopes]
    return []


def _drop_inner_rounds(basic: list[Basic], fired: list[str]) -> list[Basic]:
    kept: list[Basic] = []
    for i, op in enumerate(basic):
        later = basic[i + 1:]
        if isinstance(op, Round) and any(isinstance(o, Sum) for o in later):
            fired.append("drop_inner_round")
            continue
        kept.append(op)
    return kept


def _take_store(
    basic: list[Basic], dst: DType, options: ComposerOptions, out: Composed
) -> list[Basic]:
    """Peel the trailing [·v] [+z] [round] [clip] that oneDNN's integer store can do."""
    ops = list(basic)
    lo, hi = dst.range
    if (options.on("drop_round_clip") and len(ops) >= 3 and isinstance(ops[-1], Clip)
            and isinstance(ops[-2], Add) and isinstance(ops[-3], Round)
            and _single_clip(ops[-1], options) and _single(ops[-2].values, options)
            and float(ops[-2].values[0]).is_integer()
            and float(ops[-1].lo[0]) <= lo and float(ops[-1].hi[0]) >= hi):
        _note_uniform(out, ops[-1].lo, ops[-1].hi)
        ops = ops[:-1]  # ONNX form: round(y) + zp, an integer the store keeps exactly
        out.fired.append("drop_round_clip")
    elif (options.on("drop_round_clip") and len(ops) >= 2 and isinstance(ops[-1], Clip)
            and isinstance(ops[-2], Round) and _single_clip(ops[-1], options)
            and float(ops[-1].lo[0]) <= lo and float(ops[-1].hi[0]) >= hi):
        _note_uniform(out, ops[-1].lo, ops[-1].hi)
        ops = ops[:-2]
        out.fired.append("drop_round_clip")
    elif options.on("drop_round_clip") and ops and isinstance(ops[-1], Round):
        ops = ops[:-1]
        out.fired.append("drop_round_clip")
    if (options.on("dst_zero_point") and ops and isinstance(ops[-1], Add)
            and _single(ops[-1].values, options) and float(ops[-1].values[0]).is_integer()):
        _note_uniform(out, ops[-1].values)
        out.dst_zero_point = int(ops[-1].values[0])
        ops = ops[:-1]
        out.fired.append("dst_zero_point")
    if (options.on("dst_scale") and ops and isinstance(ops[-1], Mul)
            and ops[-1].values.size == 1 and float(ops[-1].values[0]) != 0.0):
        last = ops[-1]
        out.dst_scale = (last.inverse_of if last.inverse_of is not None
                         else float(np.float32(1.0 / np.float64(last.values[0]))))
        ops = ops[:-1]
        out.fired.append("dst_scale")
    return ops


def _append(out: Composed, op: Basic, options: ComposerOptions) -> None:
    if isinstance(op, Mul) and op.exact:  # rounded once, on its own (module docstring)
        _append_exact_mul(out, op.values, options)
    elif isinstance(op, Mul):
        _append_mul(out, op.values, options)
    elif isinstance(op, Add):
        _append_add(out, op.values, options)
    elif isinstance(op, Div):  # (one value in every channel: a scalar operand, attrs.py)
        out.post_ops.append(Binary("div", op.values))
    elif isinstance(op, Round):
        out.post_ops.append(Eltwise("round"))
    elif isinstance(op, Clip):
        if _single_clip(op, options) and options.on("per_tensor_eltwise"):
            _note_uniform(out, op.lo, op.hi)
            out.fired.append("per_tensor_eltwise")
            out.post_ops.append(Eltwise("clip", float(op.lo[0]), float(op.hi[0])))
        else:
            out.post_ops.append(Binary("max", op.lo))
            out.post_ops.append(Binary("min", op.hi))
    elif isinstance(op, Eltwise | Sum | Prelu | TensorBinary):
        out.post_ops.append(op)


def _scale_bias(out: Composed, values: np.ndarray) -> None:
    out.wei_scales = _f32(out.wei_scales.astype(np.float64) * values)
    if out.bias is not None:
        out.bias = _f32(out.bias.astype(np.float64) * values)


def _append_exact_mul(out: Composed, values: np.ndarray, options: ComposerOptions) -> None:
    """x·s as one float32 multiply after what precedes it: eltwise linear(s, 0) (its FMA
    s·x + 0 rounds once) or a binary mul, never merged with another op."""
    if options.on("skip_identity") and np.all(values == 1.0):
        out.fired.append("skip_identity")
        return
    if _single(values, options) and options.on("per_tensor_eltwise"):
        out.post_ops.append(Eltwise("linear", float(values[0]), 0.0))
        out.fired.append("per_tensor_eltwise")
        _note_uniform(out, values)
        return
    out.post_ops.append(Binary("mul", values))


def _append_mul(out: Composed, values: np.ndarray, options: ComposerOptions) -> None:
    per_tensor = values.size == 1
    if options.on("skip_identity") and np.all(values == 1.0):
        out.fired.append("skip_identity")
        return
    past_bias = out.bias is not None and per_tensor and not options.on("scale_past_bias")
    if not out.post_ops and options.on("mul_to_weight_scales") and not past_bias:
        _scale_bias(out, values)
        out.fired.append("mul_to_weight_scales")
        return
    relu_only = all(isinstance(p, Eltwise) and p.alg == "relu" for p in out.post_ops)
    if relu_only and options.on("relu_mul_swap") and np.all(values > 0) and not past_bias:
        _scale_bias(out, values)
        out.fired.append("relu_mul_swap")
        return
    if (per_tensor and options.on("sum_scale") and len(out.post_ops) == 1
            and isinstance(out.post_ops[0], Sum)):
        s = out.post_ops[0]
        out.post_ops[0] = dataclasses.replace(s, scale=float(np.float32(s.scale * values[0])))
        _scale_bias(out, values)
        out.fired.append("sum_scale")
        return
    last = out.post_ops[-1] if out.post_ops else None
    if per_tensor and isinstance(last, Eltwise) and last.alg == "linear" and options.on(
            "fold_into_linear"):
        v = float(values[0])
        out.post_ops[-1] = Eltwise("linear", float(np.float32(last.alpha * v)),
                                   float(np.float32(last.beta * v)))
        out.fired.append("fold_into_linear")
        return
    if _single(values, options) and options.on("per_tensor_eltwise"):
        out.post_ops.append(Eltwise("linear", float(values[0]), 0.0))
        out.fired.append("per_tensor_eltwise")
        _note_uniform(out, values)
        return
    out.post_ops.append(Binary("mul", values))


def _append_add(out: Composed, values: np.ndarray, options: ComposerOptions) -> None:
    per_tensor = values.size == 1
    if options.on("skip_identity") and np.all(values == 0.0):
        out.fired.append("skip_identity")
        return
    if not out.post_ops and options.on("add_to_bias"):
        bias = np.zeros(out.channels, np.float64) if out.bias is None else out.bias
        out.bias = _f32(np.broadcast_to(bias.astype(np.float64) + values, (out.channels,)))
        out.fired.append("add_to_bias")
        return
    last = out.post_ops[-1] if out.post_ops else None
    if per_tensor and isinstance(last, Eltwise) and last.alg == "linear" and options.on(
            "fold_into_linear"):
        out.post_ops[-1] = Eltwise("linear", last.alpha,
                                   float(np.float32(last.beta + float(values[0]))))
        out.fired.append("fold_into_linear")
        return
    if _single(values, options) and options.on("per_tensor_eltwise"):
        out.post_ops.append(Eltwise("linear", 1.0, float(values[0])))
        out.fired.append("per_tensor_eltwise")
        _note_uniform(out, values)
        return
    out.post_ops.append(Binary("add", values))
