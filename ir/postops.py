"""What the composer hands lowering: oneDNN 3.x attributes for one int8 compute primitive.

oneDNN 3.x computes (https://oneapi-src.github.io/oneDNN/dev_guide_attributes_quantization.html,
https://oneapi-src.github.io/oneDNN/dev_guide_attributes_post_ops.html)

    x   = f32(acc)·wei_scale[oc] + bias[oc]          (bias is added after the scale)
    x   = post_op_n(… post_op_0(x))                    (eltwise / sum / binary / prelu)
    dst = saturate(rint(x·f32(1/dst_scale) + dst_zp))  (integer dst), or x (f32 dst)

``Composed`` holds those slots; ``Mul``/``Add``/``Round``/``Clip`` are the basic operations a
post-op chain is first lowered to (the unfused mode runs each as its own primitive). The
composer (passes/composer.py) produces these; lowering and the reference interpreter read them.
``ComposerOptions`` names the composer's optimizations, so a plan can record which fired.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from qfuse.ir.chain import Act
from qfuse.ir.types import DType

OPTIMIZATIONS = (
    "skip_identity",
    "quantize_clip_after_round",
    "fold_output_shift",
    "drop_round_clip",
    "dst_zero_point",
    "dst_scale",
    "mul_to_weight_scales",
    "scale_past_bias",
    "add_to_bias",
    "relu_mul_swap",
    "sum_scale",
    "fold_into_linear",
    "per_tensor_eltwise",
    "uniform_values",
    "drop_inner_round",
    "drop_gate_quantize",
    "zero_point_before_round",
    "onnx_divide",
    "clip_shift",
    "in_place_concat",
    "merge_copies",
    "sum_in_place",
    "direct_int8",
    "fold_output_dequantize",
    "fold_float_dequantize",
    "fold_resize_dequantize",
    "unsigned_activations",
    "flatten_matmul_rows",
    "vector_matmul_as_conv",
    "patch_conv",
    "wide_conv",
    "deconv_as_depth_to_space",
    "merge_split_concat",
    "distribute_concat",
    "linear_resampling",
    "widen_gate",
    "integer_requantize",
    "pair_channels",
    "requantize_before_resize",
    "padded_depthwise",
    "conv_windows",
    "fold_stride",
    "whole_sample_norm",
)
DEFAULT_OFF = frozenset({"drop_inner_round", "drop_gate_quantize", "zero_point_before_round",
                         "scale_past_bias"})


@dataclass(frozen=True)
class ComposerOptions:
    enabled: frozenset[str] = frozenset(OPTIMIZATIONS) - DEFAULT_OFF

    def on(self, name: str) -> bool:
        return name in self.enabled

    def without(self, *names: str) -> ComposerOptions:
        return ComposerOptions(self.enabled - set(names))

    def with_(self, *names: str) -> ComposerOptions:
        unknown = set(names) - set(OPTIMIZATIONS)
        if unknown:
            raise ValueError(f"unknown composer optimizations {sorted(unknown)}")
        return ComposerOptions(self.enabled | set(names))


# ------------------------------------------------------------------ basic operations
def one_value(values: np.ndarray) -> bool:
    """Per-channel values that are all the same float32, bit for bit (or just one): -0.0
    and 0.0 differ (they multiply to different signs)."""
    v = np.asarray(values, np.float32).ravel()
    return v.size == 1 or bool(v.size and np.all(v.view(np.uint32) == v.view(np.uint32)[0]))


@dataclass(frozen=True)
class Mul:
    values: np.ndarray  # shape (1,) or (C,)
    # Set when this multiply is 1/s of a quantization with the known scale s.
    inverse_of: float | None = None
    exact: bool = False  # its own eltwise linear(s, 0): ir/chain.Scale.exact


@dataclass(frozen=True)
class Div:
    """x / values: an ONNX quantization's division by its scale (oneDNN binary_div post-op;
    x·f32(1/s) is a different float32 function, docs/numerics.md)."""

    values: np.ndarray


@dataclass(frozen=True)
class Add:
    values: np.ndarray


@dataclass(frozen=True)
class Round:
    pass


@dataclass(frozen=True)
class Clip:
    lo: np.ndarray
    hi: np.ndarray


class EltwiseAlg(StrEnum):
    """oneDNN eltwise algorithms the lowering emits (``dnnl_eltwise_<value>``)."""

    RELU = "relu"
    CLIP = "clip"
    LINEAR = "linear"
    ROUND = "round"
    LOGISTIC = "logistic"
    TANH = "tanh"
    SWISH = "swish"
    HARDSWISH = "hardswish"
    HARDSIGMOID = "hardsigmoid"
    GELU_ERF = "gelu_erf"
    GELU_TANH = "gelu_tanh"
    ELU = "elu"
    EXP = "exp"
    LOG = "log"
    ABS = "abs"
    SQRT = "sqrt"
    SQUARE = "square"
    POW = "pow"
    SOFT_RELU = "soft_relu"
    MISH = "mish"


class BinaryAlg(StrEnum):
    """oneDNN binary algorithms (``dnnl_binary_<value>``)."""

    ADD = "add"
    MUL = "mul"
    MAX = "max"
    MIN = "min"
    DIV = "div"
    SUB = "sub"


@dataclass(frozen=True)
class Eltwise:
    """oneDNN eltwise post-op ``alg(x; alpha, beta)``."""

    alg: EltwiseAlg
    alpha: float = 0.0
    beta: float = 0.0


@dataclass(frozen=True)
class Sum:
    scale: float
    zero_point: int
    dtype: DType
    port: int


@dataclass(frozen=True)
class Prelu:
    slopes: np.ndarray


@dataclass(frozen=True)
class Binary:
    """oneDNN binary post-op with a per-channel (or per-tensor) second operand."""

    alg: BinaryAlg
    values: np.ndarray


@dataclass(frozen=True)
class TensorBinary:
    """oneDNN binary post-op whose second operand is the node's input ``port`` (float32, full
    size or broadcast), read at run time (chain item TensorOperand)."""

    alg: BinaryAlg
    port: int


Basic = Mul | Div | Add | Round | Clip | Eltwise | Sum | Prelu | TensorBinary
PostOp = Eltwise | Sum | Binary | Prelu | TensorBinary

ACT_ALG = {
    Act.RELU: EltwiseAlg.RELU,
    Act.CLIP: EltwiseAlg.CLIP,
    Act.SIGMOID: EltwiseAlg.LOGISTIC,
    Act.SWISH: EltwiseAlg.SWISH,
    Act.TANH: EltwiseAlg.TANH,
    Act.HARD_SWISH: EltwiseAlg.HARDSWISH,
    Act.HARD_SIGMOID: EltwiseAlg.HARDSIGMOID,
    Act.GELU_ERF: EltwiseAlg.GELU_ERF,
    Act.GELU_TANH: EltwiseAlg.GELU_TANH,
}


def single_pixel_batch(shape: tuple[int, ...]) -> bool:
    """N > 1 images of one pixel each: oneDNN 3.2's jit binary applies per-channel binary
    post-ops wrongly there (docs/onednn.md); such tensors run over (N, C) views or unfused."""
    return len(shape) > 2 and shape[0] > 1 and math.prod(shape[2:]) == 1


def channel_in_the_middle(dims: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """A plain layout whose channel dim (1) lies between other non-unit dims in memory order,
    e.g. (N, H, C, W): oneDNN 3.2's jit binary applies per-channel binary post-ops wrongly
    there (measured: tests/runtime/test_onednn_f32.py; right with C outermost after N, as in
    nchw, or innermost, as in nhwc). Such a kernel reads a row-major copy instead."""
    if len(dims) < 3 or len(strides) != len(dims) or dims[1] == 1:
        return False
    others = [strides[i] for i in range(2, len(dims)) if dims[i] != 1]
    return any(st > strides[1] for st in others) and any(st < strides[1] for st in others)


@dataclass
class Composed:
    """oneDNN attributes for one int8 compute primitive."""

    channels: int
    dst_dtype: DType
    wei_scales: np.ndarray = field(default_factory=lambda: np.ones(1, np.float32))
    bias: np.ndarray | None = None
    post_ops: list[PostOp] = field(default_factory=list)
    dst_scale: float | None = None  # dequantization-style: dst_q = x / dst_scale + dst_zp
    dst_zero_point: int = 0
    fired: list[str] = field(default_factory=list)
    # the rounding form before passes/integer_requantize.py shortened the post-ops (it keeps
    # every result, so the kernel still rounds as this says)
    form: str | None = None

    def rounding(self) -> str:
        """How the integer store rounds (docs/numerics.md, "Rounding forms"): the ONNX form
        when an eltwise_round post-op rounds before the dst zero point is added, the level form
        when the store adds it before its rint; "" for a float dst."""
        if self.form is not None:
            return self.form
        if not self.dst_dtype.is_integer:
            return ""
        last = self.post_ops[-1] if self.post_ops else None
        rounded = isinstance(last, Eltwise) and last.alg == "round"
        scaled = self.dst_scale is not None and self.dst_scale != 1.0
        before = self.post_ops[-2 if rounded else -1] if len(self.post_ops) > rounded else None
        divided = isinstance(before, Binary) and before.alg == "div" and not scaled
        if divided and (rounded or not self.dst_zero_point):
            return "round(x/s)+zp" if self.dst_zero_point else "round(x/s)"
        if rounded and not scaled:
            return "round(x·(1/s))+zp" if self.dst_zero_point else "round(x·(1/s))"
        if self.dst_zero_point:
            return "round(x·(1/s)+zp)"
        return "round(x·(1/s))"

    def describe(self) -> list[str]:
        names = []
        for op in self.post_ops:
            if isinstance(op, Eltwise):
                names.append(f"eltwise_{op.alg}")
            elif isinstance(op, Sum):
                names.append("sum")
            elif isinstance(op, Binary):
                names.append(f"binary_{op.alg}")
            else:
                names.append("prelu")
        return names
