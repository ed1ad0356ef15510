"""Post-op chains carried by fused int8 compute nodes.

After the LPT passes, an int8 Conv / ConvTranspose / MatMul node computes the exact integer
accumulator ``acc = Σ (src_q - zp_src)·wei_q`` and then applies its chain, in order, in float32:

    x = f32(acc)                       (the chain's first Scale usually dequantizes it)
    x = op_n(... op_0(x))
    out = x                            if the node's output is f32
    out = saturate(rint(x))            if the node's output is u8/s8 (the chain's last
                                       Quantize brought x into the integer domain)

Chain items are graph-level facts (what the model computes); the composer (passes/composer.py)
turns them into oneDNN attributes. Values are tuples so the items stay hashable; a tuple of
length 1 is per tensor, of length C per output channel (channel axis 1 for conv, last for
matmul).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

import numpy as np

from qfuse.ir.types import DType, OnnxQuantize


def _vec(values: object) -> tuple[float, ...]:
    array = np.atleast_1d(np.asarray(values, dtype=np.float32)).ravel()
    return tuple(float(v) for v in array)


@dataclass(frozen=True)
class Scale:
    """x · values. ``exact``: one float32 multiply of its own, never folded into a previous
    linear (the dequantize of a graph output a kernel writes: (q - zp)·s rounded once)."""

    values: tuple[float, ...]
    exact: bool = False

    @classmethod
    def of(cls, values: object) -> Scale:
        return cls(_vec(values))


@dataclass(frozen=True)
class Shift:
    """x + values"""

    values: tuple[float, ...]

    @classmethod
    def of(cls, values: object) -> Shift:
        return cls(_vec(values))


class Act(enum.Enum):
    """Elementwise activations a chain can hold (each maps to one oneDNN eltwise alg)."""

    RELU = "relu"  # alpha = negative slope (0 for ReLU, alpha for LeakyReLU)
    CLIP = "clip"  # [alpha, beta]
    SIGMOID = "logistic"
    SWISH = "swish"  # x·sigmoid(alpha·x); alpha = 1 for SiLU
    TANH = "tanh"
    HARD_SWISH = "hardswish"  # x·max(0, min(1, alpha·x + beta)); ONNX: alpha=1/6, beta=1/2
    HARD_SIGMOID = "hardsigmoid"  # max(0, min(1, alpha·x + beta)); alpha, beta always set
    GELU_ERF = "gelu_erf"
    GELU_TANH = "gelu_tanh"


@dataclass(frozen=True)
class Activation:
    act: Act
    alpha: float = 0.0
    beta: float = 0.0


@dataclass(frozen=True)
class PRelu:
    """x if x >= 0 else slope·x, slopes per tensor or per channel."""

    slopes: tuple[float, ...]


@dataclass(frozen=True)
class Residual:
    """x + scale·(r - zero_point), r = the node's input ``port`` (same shape as the output).

    ``dtype`` is r's element type: u8/s8 for a quantized residual (scale, zero_point its
    dequantization), f32 for a float one (scale 1, zero_point 0).
    """

    port: int
    scale: float = 1.0
    zero_point: int = 0
    dtype: DType = DType.F32


# How a quantization rounds (docs/numerics.md, "Rounding forms"): ONNX QuantizeLinear rounds
# x/s and then adds the zero point; OpenVINO's FakeQuantize (and oneDNN's integer store with a
# dst zero point) round the level index x/s + zp.
ONNX_FORM = "round(x/s)+zp"
LEVEL_FORM = "round(x/s+zp)"


@dataclass(frozen=True)
class Quantize:
    """A quantize-only FakeQuantize (OpenVINO fake_quantize.md), into the integer domain:

    y = clip(x, il, ih) → (y - il)·(levels-1)/(ih-il) → round → · (oh-ol)/(levels-1) + ol

    with integer output_low/high (ol, oh), i.e. quantized values. ``dtype`` is the integer
    type the values are meant for. Ranges are per tensor or per channel.
    """

    input_low: tuple[float, ...]
    input_high: tuple[float, ...]
    output_low: tuple[float, ...]
    output_high: tuple[float, ...]
    levels: int
    dtype: DType
    # The quantized output's own per-tensor scale (its QuantParams) when known. It equals
    # (ih - il)/(levels - 1) up to float32 rounding; the composer uses it as the dst scale so
    # that oneDNN is given the model's scale exactly, not a value 1 ulp away.
    scale: float | None = None
    # The ONNX Q/DQ pair the FakeQuantize stood for (ir/types.py): then the item means ONNX's
    # saturate(rint(x / s) + zp) with the pair's scale and zero point (per tensor, or per
    # channel along the chain's channel axis), not the level index above.
    onnx: OnnxQuantize | None = None

    @property
    def rounding(self) -> str:
        """The rounding form the item means (docs/numerics.md, "Rounding forms")."""
        return ONNX_FORM if self.onnx is not None else LEVEL_FORM


@dataclass(frozen=True)
class TensorOperand:
    """x · r, x + r, x − r or x / r (``alg`` "mul" / "add" / "sub" / "div"), r = the node's
    input ``port``: a float32 tensor of the output's shape or one that broadcasts to it (a
    gate: x·Q(sigmoid(x)) when the node is the Sigmoid; a squeeze-excitation's per-channel
    gate; the float residual of an elementwise chain; F.normalize's norm, the divisor of a
    Div gate chain). oneDNN: a binary post-op reading r."""

    port: int
    alg: str = "mul"


ChainOp = Scale | Shift | Activation | PRelu | Residual | Quantize | TensorOperand


def describe(op: ChainOp) -> str:
    """Short text for `inspect`: kind plus values summarised."""

    def summary(values: tuple[float, ...]) -> str:
        if len(values) == 1:
            return f"{values[0]:.6g}"
        return f"[{len(values)}: {min(values):.4g}..{max(values):.4g}]"

    if isinstance(op, Scale):
        return f"mul {summary(op.values)}"
    if isinstance(op, Shift):
        return f"add {summary(op.values)}"
    if isinstance(op, Activation):
        args = "" if (op.alpha, op.beta) == (0.0, 0.0) else f"({op.alpha:.6g}, {op.beta:.6g})"
        return f"{op.act.value}{args}"
    if isinstance(op, PRelu):
        return f"prelu {summary(op.slopes)}"
    if isinstance(op, Residual):
        return f"sum input{op.port} (s={op.scale:.6g}, zp={op.zero_point}, {op.dtype.name})"
    if isinstance(op, TensorOperand):
        return f"{op.alg} input{op.port}"
    return (f"quantize L={op.levels} [{summary(op.input_low)}, {summary(op.input_high)}] → "
            f"[{summary(op.output_low)}, {summary(op.output_high)}] {op.dtype.name} "
            f"{op.rounding}")


@dataclass
class Fused:
    """What makes a compute node an int8 kernel with a post-op chain.

    The node computes ``acc = op(src - src_zero_point, wei - wei_zero_point)`` exactly (int32
    when src and weights are integers; float32 otherwise), then ``chain`` as described at the
    top of this module. Chain ``Residual`` items read the node's inputs by port; those inputs
    come after the op's own inputs. ``absorbed`` lists the ONNX nodes folded in; ``notes``
    records fusion decisions for `inspect`.

    ``src_scale`` (Softmax / LayerNormalization, passes/fuse_quantized_norm.py): these ops do
    not commute with scaling, so an integer source is dequantized *before* the op, exactly as
    a DequantizeLinear: ``x = f32(src - src_zero_point)·src_scale``; None everywhere else.

    ``src_zero_point_port`` (dynamic quantization: onnxruntime's quantize_dynamic writes
    ``DynamicQuantizeLinear → MatMulInteger / ConvInteger``): the src zero point is the node's
    input at this port, a u8 scalar computed at run time; ``src_zero_point`` is then 0.
    """

    chain: list[ChainOp] = dataclasses.field(default_factory=list)
    src_zero_point: int = 0
    src_zero_point_port: int | None = None
    wei_zero_point: int = 0
    src_scale: float | None = None
    absorbed: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)


def dst_quant(item: Quantize) -> tuple[float, int] | str:
    """(dst scale, dst zero point) that store ``item`` — ``saturate(rint(y/s) + zp)`` — or why
    there are none. With unit output steps ``oh - ol = L - 1`` the FakeQuantize is
    ``round((y - il)/(ih - il)·(L - 1)) + ol = round(y/s) + zp``, ``s = (ih - il)/(L - 1)``
    (the model's own scale when known), ``zp = ol - il/s``, and [ol, oh] must cover the type
    (the store saturates there). The standalone quantize reorder took the same (lower_quant.py);
    near-ties may round one step apart from the FakeQuantize's division."""
    il, ih, ol, oh = (v[0] for v in (item.input_low, item.input_high, item.output_low,
                                     item.output_high))
    lo, hi = item.dtype.range
    if item.onnx is not None and item.onnx.quant.per_tensor:
        return item.onnx.quant.scale[0], item.onnx.quant.zero_point[0]
    if not ih > il or oh - ol != item.levels - 1 or ol > lo or oh < hi:
        return (f"the quantize [{il:.6g}, {ih:.6g}] → [{ol:g}, {oh:g}] ({item.levels} levels) "
                f"is not a dst scale and zero point onto {item.dtype.name}")
    s = item.scale if item.scale is not None else float(np.float32((ih - il) / (oh - ol)))
    zp = ol - il / s
    if abs(zp - round(zp)) > 1e-3:
        return f"the quantize's zero point {zp:.6g} is not an integer"
    return s, round(zp)
