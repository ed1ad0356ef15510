"""qfuse numerics: rounding, ONNX quantize / dequantize, fixed-point multipliers, and the
requantization arithmetic of TFLite, ONNX Runtime, Caffe2, oneDNN and TPU-MLIR, bit-exact.

Each submodule states its formulas in its docstring: ``rounding`` (tie rules, saturation),
``qdq`` (QuantizeLinear / DequantizeLinear), ``multiplier`` (TFLite QuantizeMultiplier,
TPU-MLIR multiplier + rshift), ``gemmlowp`` (SRDHM, RoundingDivideByPOT), ``schemes``
(``requantize`` and the per-framework functions), ``ops`` (avgpool, add, leaky relu, prelu,
pad), ``error`` (error statistics), ``pairs`` (u8·s8 products summed in saturating int16
pairs).
docs/numerics.md compares the schemes with measured numbers.
"""

from __future__ import annotations

from qfuse.runtime.numerics.error import (
    ErrorStats,
    StepDiff,
    cosine,
    quantization_error,
    step_diff,
)
from qfuse.runtime.numerics.gemmlowp import (
    multiply_by_quantized_multiplier,
    rounding_divide_by_pot,
    srdhm,
    wrap_int32,
)
from qfuse.runtime.numerics.multiplier import (
    effective_scale,
    quantize_multiplier,
    tpu_multiplier_rshift,
)
from qfuse.runtime.numerics.ops import (
    add_float,
    add_int16,
    add_multipliers,
    avgpool_float,
    avgpool_int,
    avgpool_params,
    leaky_relu_int,
    pad_value,
    prelu_int,
)
from qfuse.runtime.numerics.qdq import check_scale, check_zero_point, dequantize, quantize
from qfuse.runtime.numerics.rounding import (
    Rounding,
    dtype_range,
    resolve_dtype,
    round_half_away,
    round_half_even,
    round_half_up,
    round_with,
    saturate,
    shift_right_round,
)
from qfuse.runtime.numerics.schemes import (
    Scheme,
    channel_broadcast,
    requantize,
    requantize_onednn,
    requantize_onnxruntime,
    requantize_tflite,
    requantize_tpu_mlir,
    tflite_scheme,
)

__all__ = [
    "ErrorStats",
    "Rounding",
    "Scheme",
    "StepDiff",
    "add_float",
    "add_int16",
    "add_multipliers",
    "avgpool_float",
    "avgpool_int",
    "avgpool_params",
    "channel_broadcast",
    "check_scale",
    "check_zero_point",
    "cosine",
    "dequantize",
    "dtype_range",
    "effective_scale",
    "leaky_relu_int",
    "multiply_by_quantized_multiplier",
    "pad_value",
    "prelu_int",
    "quantization_error",
    "quantize",
    "quantize_multiplier",
    "requantize",
    "requantize_onednn",
    "requantize_onnxruntime",
    "requantize_tflite",
    "requantize_tpu_mlir",
    "resolve_dtype",
    "round_half_away",
    "round_half_even",
    "round_half_up",
    "round_with",
    "rounding_divide_by_pot",
    "saturate",
    "shift_right_round",
    "srdhm",
    "step_diff",
    "tflite_scheme",
    "tpu_multiplier_rshift",
    "wrap_int32",
]
