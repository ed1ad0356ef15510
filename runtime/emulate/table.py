"""The emulation table: (framework, pattern) -> the kernel that computes it in integers.

``Pattern.QUANTIZE`` entries are not integer kernels: they quantize the float path's value with
the framework's own quantizer (runtime/emulate/quant.py). A pair missing from ``TABLE`` has no
integer form here: the emulator runs that pattern on the
float path (``DequantizeLinear -> op -> QuantizeLinear`` with the reference interpreter's exact
ONNX semantics) and records ``FLOAT_REASONS[(framework, pattern)]`` as the reason. The same
table, in words, is in docs/numerics.md ("Emulating a framework").
"""

from __future__ import annotations

import enum
from typing import Final

from qfuse.runtime.emulate import compute, eltwise, pool, quant
from qfuse.runtime.emulate.kernel import Kernel
from qfuse.runtime.emulate.patterns import Pattern

__all__ = ["FLOAT_REASONS", "TABLE", "Framework"]


class Framework(enum.Enum):
    TFLITE = "tflite"
    ONNXRUNTIME = "onnxruntime"
    CAFFE2 = "caffe2"
    ONEDNN = "onednn"
    TPU_MLIR = "tpu-mlir"


F, P = Framework, Pattern

TABLE: Final[dict[tuple[Framework, Pattern], Kernel]] = {
    (F.TFLITE, P.COMPUTE): compute.tflite,
    (F.ONNXRUNTIME, P.COMPUTE): compute.onnxruntime,
    (F.CAFFE2, P.COMPUTE): compute.caffe2,
    (F.ONEDNN, P.COMPUTE): compute.onednn,
    (F.TPU_MLIR, P.COMPUTE): compute.tpu_mlir,
    (F.TFLITE, P.ADD): eltwise.add_tflite,
    (F.ONNXRUNTIME, P.ADD): eltwise.add_onnxruntime,
    (F.CAFFE2, P.ADD): eltwise.add_tflite,  # caffe2's Int8Add is TFLite's kernel
    (F.ONEDNN, P.ADD): eltwise.add_onednn,
    (F.TPU_MLIR, P.ADD): eltwise.add_tpu_mlir,
    (F.TFLITE, P.AVGPOOL): pool.avgpool_tflite,
    (F.ONNXRUNTIME, P.AVGPOOL): pool.avgpool_onnxruntime,
    (F.CAFFE2, P.AVGPOOL): pool.avgpool_caffe2,
    (F.ONEDNN, P.AVGPOOL): pool.avgpool_onednn,
    (F.TPU_MLIR, P.AVGPOOL): pool.avgpool_tpu_mlir,
    (F.TFLITE, P.GLOBAL_AVGPOOL): pool.gap_tflite,
    (F.ONNXRUNTIME, P.GLOBAL_AVGPOOL): pool.gap_onnxruntime,
    (F.CAFFE2, P.GLOBAL_AVGPOOL): pool.gap_caffe2,
    (F.ONEDNN, P.GLOBAL_AVGPOOL): pool.avgpool_onednn,
    (F.TPU_MLIR, P.GLOBAL_AVGPOOL): pool.avgpool_tpu_mlir,
    (F.TFLITE, P.LEAKY_RELU): eltwise.leaky_relu_tflite,
    (F.TPU_MLIR, P.LEAKY_RELU): eltwise.leaky_relu_tpu_mlir,
    (F.TFLITE, P.PRELU): eltwise.prelu_tflite,
    (F.TPU_MLIR, P.PRELU): eltwise.prelu_tpu_mlir,
    (F.TFLITE, P.QUANTIZE): quant.quantize_tflite,
    (F.ONEDNN, P.QUANTIZE): quant.quantize_onednn,
}

FLOAT_REASONS: Final[dict[tuple[Framework, Pattern], str]] = {
    (F.ONNXRUNTIME, P.LEAKY_RELU): "QLinearLeakyRelu is a 256-entry table built with the float "
    "formula, which the float path reproduces",
    (F.ONNXRUNTIME, P.PRELU): "ONNX Runtime has no quantized PRelu; it runs DQ -> PRelu -> Q",
    (F.CAFFE2, P.LEAKY_RELU): "no integer LeakyRelu known for Caffe2 (SNPS-Caffe QUANTIZED_OP.md: TFLite only)",
    (F.CAFFE2, P.PRELU): "no integer PRelu known for Caffe2",
    (F.ONEDNN, P.LEAKY_RELU): "an f32 eltwise post-op; emulated as DQ -> op -> Q",
    (F.ONEDNN, P.PRELU): "an f32 prelu post-op; emulated as DQ -> op -> Q",
}


def float_reason(framework: Framework, pattern: Pattern) -> str:
    return FLOAT_REASONS.get(
        (framework, pattern), f"{framework.value} has no integer form of {pattern.value}"
    )
