"""Typed operations: one enum member per op, one frozen dataclass of attributes per op.

ONNX strings are parsed once, in the importer; everything after works with these types.
Quantization parameters (scales, zero points, FakeQuantize ranges), Clip bounds given as
inputs, and weights stay *inputs* (constant values in the graph), as in ONNX, so that the
reference interpreter and the passes read them the same way. Attributes hold only what
shapes the computation.

Spatial conventions (all resolved by the importer, never "auto"):
``pads`` = (begin_0, ..., begin_{n-1}, end_0, ..., end_{n-1}) as in ONNX;
``dilations`` are ONNX dilations (1 = dense).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from qfuse.ir.types import DType, OnnxQuantize, TensorInfo


class Op(enum.Enum):
    # quantization
    QUANTIZE_LINEAR = "QuantizeLinear"
    DEQUANTIZE_LINEAR = "DequantizeLinear"
    FAKE_QUANTIZE = "FakeQuantize"
    DYNAMIC_QUANTIZE_LINEAR = "DynamicQuantizeLinear"  # x → (y u8, scale [], zero point [])
    # compute
    CONV = "Conv"
    CONV_TRANSPOSE = "ConvTranspose"
    GEMM = "Gemm"
    MATMUL = "MatMul"
    # elementwise binary
    ADD = "Add"
    SUB = "Sub"
    MUL = "Mul"
    DIV = "Div"
    SUM = "Sum"
    MAX = "Max"  # two tensors (one constant value is a Clip, compiler/onnx_import/convert_math.py)
    MIN = "Min"
    # activations
    RELU = "Relu"
    CLIP = "Clip"
    LEAKY_RELU = "LeakyRelu"
    PRELU = "PRelu"
    SIGMOID = "Sigmoid"
    SWISH = "Swish"  # x·sigmoid(x) (SiLU); made by passes/fuse_gated_activation.py, not imported
    TANH = "Tanh"
    HARD_SIGMOID = "HardSigmoid"
    HARD_SWISH = "HardSwish"
    GELU = "Gelu"
    # normalization
    SOFTMAX = "Softmax"
    LOG_SOFTMAX = "LogSoftmax"
    LAYER_NORM = "LayerNormalization"
    BATCH_NORM = "BatchNormalization"
    LRN = "LRN"
    # reductions (ReduceAttrs); LogSum / LogSumExp have no oneDNN algorithm and stay islands
    REDUCE_MEAN = "ReduceMean"
    REDUCE_MAX = "ReduceMax"
    REDUCE_MIN = "ReduceMin"
    REDUCE_SUM = "ReduceSum"
    REDUCE_PROD = "ReduceProd"
    REDUCE_L1 = "ReduceL1"
    REDUCE_L2 = "ReduceL2"
    REDUCE_SUM_SQUARE = "ReduceSumSquare"
    # float unary math
    SQRT = "Sqrt"
    EXP = "Exp"
    LOG = "Log"
    POW = "Pow"  # x ** exponent, the exponent a constant scalar (PowAttrs)
    # pooling
    MAX_POOL = "MaxPool"
    AVG_POOL = "AveragePool"
    GLOBAL_AVG_POOL = "GlobalAveragePool"
    GLOBAL_MAX_POOL = "GlobalMaxPool"
    # data movement
    CONCAT = "Concat"
    SPLIT = "Split"
    SLICE = "Slice"
    RESHAPE = "Reshape"
    FLATTEN = "Flatten"
    TRANSPOSE = "Transpose"
    SQUEEZE = "Squeeze"
    UNSQUEEZE = "Unsqueeze"
    PAD = "Pad"
    EXPAND = "Expand"  # broadcast to a static shape (ExpandAttrs)
    DEPTH_TO_SPACE = "DepthToSpace"
    RESIZE = "Resize"
    IDENTITY = "Identity"
    DROPOUT = "Dropout"
    CAST = "Cast"
    WHERE = "Where"  # (condition, x, y): x where the condition holds, else y; broadcast
    GATHER = "Gather"  # (data, indices) along an axis (AxisAttrs): run-time or scattered indices
    # comparisons and logic to a bool tensor (LogicAttrs: which one), broadcast: the masks
    # NLP models compute from an attention mask input
    LOGIC = "Logic"
    # opaque float compute: an ONNX subgraph run by onnxruntime or onnx.reference
    ISLAND = "Island"
    # an 8-bit → 8-bit elementwise function given by its value for each of the 256 inputs
    TABLE = "Table"


@dataclass(frozen=True)
class NoAttrs:
    pass


@dataclass(frozen=True)
class QuantizeAttrs:
    """QuantizeLinear: ``y = saturate(round_half_even(x / scale) + zp)`` into ``dtype``."""

    dtype: DType
    axis: int = 1


@dataclass(frozen=True)
class DequantizeAttrs:
    """DequantizeLinear: ``y = (x - zp) * scale`` in float32."""

    axis: int = 1


@dataclass(frozen=True)
class FakeQuantizeAttrs:
    """Inputs x, input_low, input_high, output_low, output_high (OpenVINO fake_quantize.md definition).

    The output element type lives in the output TensorInfo: f32 for a full FakeQuantize, u8/s8
    for a quantize-only one (after decomposition; output_low/high are then integers).

    ``onnx``: set when the FakeQuantize stands for an ONNX QuantizeLinear (→ DequantizeLinear)
    pair (passes/qdq_to_fake_quantize.py); it then rounds the ONNX way with the pair's own
    scale and zero point (``OnnxQuantize``), not the level index.
    """

    levels: int
    onnx: OnnxQuantize | None = None


@dataclass(frozen=True)
class ConvAttrs:
    kernel_shape: tuple[int, ...]
    strides: tuple[int, ...]
    pads: tuple[int, ...]
    dilations: tuple[int, ...]
    group: int = 1


@dataclass(frozen=True)
class ConvTransposeAttrs:
    kernel_shape: tuple[int, ...]
    strides: tuple[int, ...]
    pads: tuple[int, ...]
    dilations: tuple[int, ...]
    output_padding: tuple[int, ...]
    group: int = 1


@dataclass(frozen=True)
class GemmAttrs:
    alpha: float = 1.0
    beta: float = 1.0
    trans_a: bool = False
    trans_b: bool = False


@dataclass(frozen=True)
class ClipAttrs:
    """Bounds are attributes here (the importer reads ONNX's optional min/max inputs)."""

    min: float = float("-inf")
    max: float = float("inf")


@dataclass(frozen=True)
class AlphaAttrs:
    """LeakyRelu (alpha = negative slope)."""

    alpha: float = 0.01


@dataclass(frozen=True)
class HardSigmoidAttrs:
    alpha: float = 0.2
    beta: float = 0.5


@dataclass(frozen=True)
class HardSwishAttrs:
    """x·max(0, min(1, alpha·x + beta)); ONNX's HardSwish is alpha = 1/6, beta = 1/2 (the
    defaults). Other values come from gated activations (passes/fuse_gated_activation.py)."""

    alpha: float = 1.0 / 6.0
    beta: float = 0.5


class GeluApprox(enum.Enum):
    NONE = "none"  # 0.5·x·(1 + erf(x/√2))
    TANH = "tanh"  # 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))


@dataclass(frozen=True)
class GeluAttrs:
    approximate: GeluApprox = GeluApprox.NONE


@dataclass(frozen=True)
class AxisAttrs:
    """Softmax, Concat, Flatten: one axis (non-negative, resolved by the importer)."""

    axis: int


@dataclass(frozen=True)
class LayerNormAttrs:
    """Inputs x, scale, optional bias; normalizes over dims axis..rank-1."""

    axis: int
    epsilon: float = 1e-5


@dataclass(frozen=True)
class BatchNormAttrs:
    """Inputs x, scale, bias, mean, var (inference form)."""

    epsilon: float = 1e-5


@dataclass(frozen=True)
class LrnAttrs:
    """ONNX LRN across channels: ``y = x / (bias + alpha/size · Σ x²)^beta``, the sum over
    channels c - floor((size-1)/2) .. c + ceil((size-1)/2) clipped to [0, C)."""

    size: int
    alpha: float = 1e-4
    beta: float = 0.75
    bias: float = 1.0


@dataclass(frozen=True)
class ReduceAttrs:
    """Reduce* over ``axes`` (non-negative, sorted, non-empty: the importer resolves ONNX's
    negative axes, its axes input and an empty list meaning every axis); ``keepdims`` keeps
    them as size-1 dims."""

    axes: tuple[int, ...]
    keepdims: bool = True


@dataclass(frozen=True)
class PowAttrs:
    """Pow with a constant scalar exponent (the importer reads ONNX's second input)."""

    exponent: float


@dataclass(frozen=True)
class PoolAttrs:
    kernel_shape: tuple[int, ...]
    strides: tuple[int, ...]
    pads: tuple[int, ...]
    dilations: tuple[int, ...]
    ceil_mode: bool = False
    count_include_pad: bool = False


@dataclass(frozen=True)
class SplitAttrs:
    axis: int
    sizes: tuple[int, ...]


@dataclass(frozen=True)
class SliceAttrs:
    """Per listed axis: start, end and step as ONNX gives them (after constant inputs are read).

    ONNX's clamping rules apply at evaluation; for a negative step an end below -dim means
    "through index 0" (the importer stores such ends as they are, never as -1).
    """

    starts: tuple[int, ...]
    ends: tuple[int, ...]
    axes: tuple[int, ...]
    steps: tuple[int, ...]


@dataclass(frozen=True)
class ReshapeAttrs:
    """Reshape / Squeeze / Unsqueeze are all lowered to an explicit static output shape."""

    shape: tuple[int, ...]


@dataclass(frozen=True)
class TransposeAttrs:
    perm: tuple[int, ...]


@dataclass(frozen=True)
class AxesAttrs:
    """Squeeze / Unsqueeze axes (non-negative, sorted)."""

    axes: tuple[int, ...]


class PadMode(enum.Enum):
    CONSTANT = "constant"
    REFLECT = "reflect"
    EDGE = "edge"


@dataclass(frozen=True)
class ExpandAttrs:
    """Expand: x broadcast to ``shape``, the output's shape (ONNX's bidirectional broadcast of
    x's shape and the requested one, resolved at import)."""

    shape: tuple[int, ...]


@dataclass(frozen=True)
class DepthToSpaceAttrs:
    """ONNX DepthToSpace (https://onnx.ai/onnx/operators/onnx__DepthToSpace.html): channel
    blocks of ``blocksize``² moved into blocksize x blocksize pixels. ``mode`` "DCR": channel
    ``(i·b + j)·C' + c`` goes to pixel (y·b + i, x·b + j) of channel c; "CRD": channel
    ``c·b² + i·b + j``."""

    blocksize: int
    mode: str = "DCR"

    def channel_steps(self, channels_out: int) -> tuple[int, int, int]:
        """How far the input channel index moves per output channel c, block row i and block
        column j (the input channel is ``c·steps[0] + i·steps[1] + j·steps[2]``)."""
        b = self.blocksize
        if self.mode == "DCR":
            return 1, b * channels_out, channels_out
        return b * b, b, 1


@dataclass(frozen=True)
class PadAttrs:
    """``pads`` as ONNX: begins then ends, one per dim of the input. ``value`` in x's domain."""

    pads: tuple[int, ...]
    mode: PadMode = PadMode.CONSTANT
    value: float = 0.0


class ResizeMode(enum.Enum):
    NEAREST = "nearest"
    LINEAR = "linear"
    CUBIC = "cubic"


@dataclass(frozen=True)
class ResizeAttrs:
    """Output size is resolved by the importer; ``scales`` kept for the coordinate transform.
    ``cubic_coeff_a`` and ``exclude_outside`` are ONNX's, read by the cubic mode only."""

    mode: ResizeMode
    sizes: tuple[int, ...]
    scales: tuple[float, ...]
    coordinate_transformation_mode: str = "half_pixel"
    nearest_mode: str = "round_prefer_floor"
    cubic_coeff_a: float = -0.75
    exclude_outside: bool = False


@dataclass(frozen=True)
class CastAttrs:
    to: DType


#: ONNX's comparison and logical ops (LogicAttrs.op): their numpy functions
LOGIC_OPS = {"Equal": "equal", "Less": "less", "Greater": "greater",
             "LessOrEqual": "less_equal", "GreaterOrEqual": "greater_equal",
             "And": "logical_and", "Or": "logical_or", "Xor": "logical_xor",
             "Not": "logical_not"}


@dataclass(frozen=True)
class LogicAttrs:
    op: str  # a key of LOGIC_OPS


class IslandEngine(enum.Enum):
    ONNXRUNTIME = "onnxruntime"
    ONNX_REFERENCE = "onnx.reference"


# ONNX ops that map each element to one element of the same type by itself: an island made
# only of them computes the same bytes whatever order the elements are laid out in
UNARY_ELEMENTWISE = frozenset({
    "Erf", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh",
    "Atanh", "Softplus", "Softsign", "Neg", "Abs", "Sign", "Floor", "Ceil", "Round",
    "Reciprocal", "Exp", "Log", "Sqrt"})


@dataclass(frozen=True)
class IslandAttrs:
    """A float island: ONNX nodes qfuse does not lower natively, kept as an ONNX model.

    ``model`` is a serialized onnx.ModelProto whose graph inputs are the node's inputs and
    whose graph outputs are the node's outputs, in port order (constants it reads are its own
    initializers). ``infos`` are the output infos; ``dynamic`` marks outputs whose shape is known
    only at run time (they may only be graph outputs). ``engine`` runs it in the compiled modes,
    ``reason`` says why these nodes are not lowered natively, ``ops`` lists their op types.
    """

    model: bytes
    ops: tuple[str, ...]
    nodes: tuple[str, ...]
    engine: IslandEngine
    reason: str
    infos: tuple[TensorInfo, ...]
    dynamic: tuple[bool, ...]


@dataclass(frozen=True, eq=False)
class TableAttrs:
    """Table: ``y = table[x]`` elementwise, x and y 8-bit (passes/table_lookup.py).

    ``by_byte[b]`` is y's byte for the input whose byte is b (an s8 input's -1 is byte 255);
    ``info`` is y's TensorInfo; ``nodes`` names the nodes the table stands for and ``ops``
    their op types (what `inspect` shows).
    """

    by_byte: np.ndarray  # uint8, 256 entries
    info: TensorInfo
    nodes: tuple[str, ...]
    ops: tuple[str, ...]


# The attribute class each op carries; a missing entry is a bug the verifier reports.
ATTRS: dict[Op, type] = {
    Op.QUANTIZE_LINEAR: QuantizeAttrs,
    Op.DEQUANTIZE_LINEAR: DequantizeAttrs,
    Op.FAKE_QUANTIZE: FakeQuantizeAttrs,
    Op.CONV: ConvAttrs,
    Op.CONV_TRANSPOSE: ConvTransposeAttrs,
    Op.GEMM: GemmAttrs,
    Op.MATMUL: NoAttrs,
    Op.ADD: NoAttrs,
    Op.SUB: NoAttrs,
    Op.MUL: NoAttrs,
    Op.DIV: NoAttrs,
    Op.SUM: NoAttrs,
    Op.MAX: NoAttrs,
    Op.MIN: NoAttrs,
    Op.RELU: NoAttrs,
    Op.CLIP: ClipAttrs,
    Op.LEAKY_RELU: AlphaAttrs,
    Op.PRELU: NoAttrs,
    Op.SIGMOID: NoAttrs,
    Op.SWISH: NoAttrs,
    Op.TANH: NoAttrs,
    Op.HARD_SIGMOID: HardSigmoidAttrs,
    Op.HARD_SWISH: HardSwishAttrs,
    Op.GELU: GeluAttrs,
    Op.SOFTMAX: AxisAttrs,
    Op.LOG_SOFTMAX: AxisAttrs,
    Op.LAYER_NORM: LayerNormAttrs,
    Op.BATCH_NORM: BatchNormAttrs,
    Op.LRN: LrnAttrs,
    **{op: ReduceAttrs for op in (Op.REDUCE_MEAN, Op.REDUCE_MAX, Op.REDUCE_MIN, Op.REDUCE_SUM,
                                  Op.REDUCE_PROD, Op.REDUCE_L1, Op.REDUCE_L2,
                                  Op.REDUCE_SUM_SQUARE)},
    Op.SQRT: NoAttrs,
    Op.EXP: NoAttrs,
    Op.LOG: NoAttrs,
    Op.POW: PowAttrs,
    Op.MAX_POOL: PoolAttrs,
    Op.AVG_POOL: PoolAttrs,
    Op.GLOBAL_AVG_POOL: NoAttrs,
    Op.GLOBAL_MAX_POOL: NoAttrs,
    Op.CONCAT: AxisAttrs,
    Op.SPLIT: SplitAttrs,
    Op.SLICE: SliceAttrs,
    Op.RESHAPE: ReshapeAttrs,
    Op.FLATTEN: AxisAttrs,
    Op.TRANSPOSE: TransposeAttrs,
    Op.SQUEEZE: AxesAttrs,
    Op.UNSQUEEZE: AxesAttrs,
    Op.PAD: PadAttrs,
    Op.EXPAND: ExpandAttrs,
    Op.DEPTH_TO_SPACE: DepthToSpaceAttrs,
    Op.RESIZE: ResizeAttrs,
    Op.IDENTITY: NoAttrs,
    Op.DYNAMIC_QUANTIZE_LINEAR: NoAttrs,
    Op.DROPOUT: NoAttrs,
    Op.CAST: CastAttrs,
    Op.WHERE: NoAttrs,
    Op.GATHER: AxisAttrs,
    Op.LOGIC: LogicAttrs,
    Op.ISLAND: IslandAttrs,
    Op.TABLE: TableAttrs,
}

# (min, max) number of inputs each op takes; None = unbounded. Optional inputs are "".
ARITY: dict[Op, tuple[int, int | None]] = {
    Op.QUANTIZE_LINEAR: (2, 3),
    Op.DEQUANTIZE_LINEAR: (2, 3),
    Op.FAKE_QUANTIZE: (5, 5),
    Op.CONV: (2, 3),
    Op.CONV_TRANSPOSE: (2, 3),
    Op.GEMM: (2, 3),
    Op.MATMUL: (2, 2),
    Op.ADD: (2, 2),
    Op.SUB: (2, 2),
    Op.MUL: (2, 2),
    Op.DIV: (2, 2),
    Op.MAX: (2, 2),
    Op.MIN: (2, 2),
    Op.SUM: (1, None),
    Op.PRELU: (2, 2),
    Op.WHERE: (3, 3),
    Op.GATHER: (2, 2),
    Op.LOGIC: (1, 2),
    Op.LAYER_NORM: (2, 3),
    Op.BATCH_NORM: (5, 5),
    Op.CONCAT: (1, None),
    Op.ISLAND: (0, None),
}


def arity(op: Op) -> tuple[int, int | None]:
    return ARITY.get(op, (1, 1))
