"""Quantize a float model the way users do: onnxruntime.quantization.quantize_static, QDQ format.

The recipe is ONNX Runtime's own CPU recommendation for x86 with VNNI:

1. `quant_pre_process` (quantize_static logs "Please consider to run pre-processing before
   quantization" without it). It runs ONNX shape inference and ONNX Runtime's *basic* graph
   optimizations (all offline), which change the graph before quantization:
   - Conv+BatchNormalization fusion: **the quantized models contain no BatchNormalization**;
     every conv gets a bias (tensor names like ``ConvBnFusion_BN_B_...``). The float models
     keep BN, PyTorch-export style, so the compiler's own BN folding is tested on them;
   - MatMulAddFusion: a 3-D MatMul(x, W) + Add(b) becomes Reshape([-1, K]) -> Gemm(transB=0)
     -> Reshape back (node names ``gemm_input_reshape*`` / ``*MatMulAddFusion``);
   - the model gets opset imports for ai.onnx.ml, com.microsoft and other domains it never
     uses, and metadata ``onnx.quant.pre_process``.
   Symbolic shape inference needs sympy and adds nothing for these static-shape models, so it
   is skipped when sympy is missing. `preprocess=False` skips the whole step: quantize_static
   then quantizes BatchNormalization itself (Q/DQ around it, s8 scale, s32 bias) and keeps
   MatMul + Add (the Add's bias becomes a *u8* initializer -> DequantizeLinear).
2. `quantize_static` with a CalibrationDataReader over generated samples, QuantFormat.QDQ,
   CalibrationMethod.MinMax, activations QUInt8 (asymmetric), weights QInt8 (symmetric, zero
   point 0), per-channel weights by default, reduce_range False, and no extra options — the
   defaults users keep. What the result looks like (checked on every zoo model):
   - weights are stored already quantized: an int8 initializer -> DequantizeLinear(axis) with
     a per-channel float scale and int8 zero point 0, no QuantizeLinear. axis is 0 for Conv and
     Gemm(transB=1), 1 for ConvTranspose ([Cin, Cout, k, k]) and for MatMul / Gemm(transB=0);
   - biases of Conv / ConvTranspose / Gemm are int32 initializers -> DequantizeLinear(axis=0)
     with scale = s_x * s_w[oc] and int32 zero point 0;
   - Relu and Clip are *removed* (QDQKeepRemovableActivations=False), also after a residual
     Add: the QuantizeLinear of the producer gets the activation's output range ([0, max],
     zero point 0) and its saturation to [0, 255] *is* the ReLU / ReLU6;
   - every op in ONNX Runtime's quantizable set (Conv, Gemm, MatMul, Add, Mul, Concat, Softmax,
     GlobalAveragePool, LayerNormalization, MaxPool, AveragePool, Resize, Reshape, Transpose,
     Flatten, Split, ...) gets DQ on its activation inputs and Q -> DQ on its output; each
     tensor has exactly one Q -> DQ pair shared by all its consumers;
   - MaxPool, AveragePool, Resize, Reshape, Transpose, Flatten and Split reuse their input's
     scale and zero point on the output; Concat inputs keep their own scales (the output gets
     the union range); Add/Mul/Softmax outputs get their own calibrated scale (Softmax: 1/255,
     zero point 0);
   - scalar constants of Add / Mul (1/sqrt(dk), GELU's 0.5, 1.0, 0.044715) become u8
     initializers -> DequantizeLinear with scale c/255, zero point 0 (so q = 255);
   - LayerNormalization's gamma is quantized per *tensor* (s8, it warns "Axis 1 is
     out-of-range"), its beta is int32 with scale s_x * s_gamma;
   - ops outside that set (Div, Erf, Gelu, Pow's float exponent, Tanh) stay float; their
     output is quantized only if the consumer quantizes its input (Gelu's output goes in float
     to the Reshape that MatMulAddFusion inserted, which is then quantized).
"""

from __future__ import annotations

import importlib.util
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_static,
)
from onnxruntime.quantization.shape_inference import quant_pre_process


class ListDataReader(CalibrationDataReader):
    """Feeds a fixed list of input dicts to the calibrator, once."""

    def __init__(self, samples: Iterable[Mapping[str, np.ndarray]]) -> None:
        self._samples = [dict(s) for s in samples]
        self._it = iter(self._samples)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)

    def rewind(self) -> None:
        self._it = iter(self._samples)


def pre_process(model: onnx.ModelProto, workdir: Path) -> onnx.ModelProto:
    """ONNX Runtime's recommended pre-processing (shape inference + basic optimizations)."""
    src, dst = workdir / "float.onnx", workdir / "preprocessed.onnx"
    onnx.save(model, src)
    quant_pre_process(
        src,
        dst,
        skip_symbolic_shape=importlib.util.find_spec("sympy") is None,
    )
    return onnx.load(dst)


def quantize(
    float_model: onnx.ModelProto,
    calib_inputs: Iterable[Mapping[str, np.ndarray]],
    *,
    per_channel: bool = True,
    activation_type: QuantType = QuantType.QUInt8,
    weight_type: QuantType = QuantType.QInt8,
    preprocess: bool = True,
    reduce_range: bool = False,
    op_types_to_quantize: list[str] | None = None,
    nodes_to_exclude: list[str] | None = None,
    extra_options: dict[str, Any] | None = None,
    quant_format: QuantFormat = QuantFormat.QDQ,
) -> onnx.ModelProto:
    """Return the model that quantize_static makes from `float_model` and `calib_inputs` (QDQ
    unless `quant_format` says QuantFormat.QOperator: QLinearConv, QLinearMatMul, QGemm and
    the com.microsoft QLinear* ops)."""
    with tempfile.TemporaryDirectory(prefix="qfuse-zoo-") as tmp:
        work = Path(tmp)
        model = pre_process(float_model, work) if preprocess else float_model
        src, dst = work / "input.onnx", work / "quantized.onnx"
        onnx.save(model, src)
        quantize_static(
            src,
            dst,
            ListDataReader(calib_inputs),
            quant_format=quant_format,
            per_channel=per_channel,
            reduce_range=reduce_range,
            activation_type=activation_type,
            weight_type=weight_type,
            calibrate_method=CalibrationMethod.MinMax,
            op_types_to_quantize=op_types_to_quantize,
            nodes_to_exclude=nodes_to_exclude,
            extra_options=extra_options or {},
        )
        quantized = onnx.load(dst)
    quantized.doc_string = float_model.doc_string
    return quantized
