"""The three ways users quantize a float ONNX model, as each tool's documentation shows them.

- ``qdq``: ONNX Runtime's recipe: ``quant_pre_process`` (symbolic shape inference, ONNX shape
  inference and ORT's basic graph optimizations: BatchNorm folded into Conv, constants folded),
  then ``quantize_static`` with ``QuantFormat.QDQ``. When ``quant_pre_process`` raises with its
  defaults (symbolic shape inference needs sympy, and fails on some graphs) it is rerun with
  ``skip_symbolic_shape=True`` and the failure is recorded as a note. When the result does
  not load in onnxruntime because the model's opset is below 13 (quantize_static writes
  per-channel DequantizeLinear with an ``axis`` there anyway), the pre-processed model is
  converted to opset 13 with ``onnx.version_converter`` and quantized again, also noted.
- ``qoperator``: the same pre-processing, then ``quantize_static`` with ``QuantFormat.QOperator``
  (QLinearConv, QLinearMatMul, com.microsoft QLinearAdd / QLinearSigmoid / ... ops).
- ``nncf``: ``nncf.quantize(model, nncf.Dataset(calibration))`` on the float model, NNCF's ONNX
  backend with its defaults (preset PERFORMANCE: symmetric 8-bit quantizers, u8 where the
  tensor is non-negative and s8 elsewhere, MinMax ranges, Fast Bias Correction). Weights are
  per-channel s8 initializers -> DequantizeLinear at opset >= 13; at opset 11/12 (the PP-OCR
  models) NNCF warns and quantizes them per tensor, left float behind QuantizeLinear ->
  DequantizeLinear.

Both quantize_static calls use the options the project's other zoo uses (and ORT's x86
guidance): u8 activations, s8 per-channel weights, MinMax calibration, ``reduce_range=False``.

``VARIANTS``: the other options users set, each one change from those recipes (for
benchmarks/arch_sweep.py ``--quantizers``):

- ``qdq-default``: quantize_static's own defaults, what a user who sets no option gets: s8
  asymmetric activations (``activation_type=QInt8``: a ReLU's output has zero point -128)
  and per-tensor s8 weights (``per_channel=False``);
- ``qdq-dedicated``: ``extra_options={"DedicatedQDQPair": True}`` (a Q/DQ pair per reader);
- ``qdq-s8``: s8 activations, ``ActivationSymmetric`` (zero point 0);
- ``qdq-tensor``: per-tensor weights with ``reduce_range=True`` (7-bit weights);
- ``qdq-u8w``: u8 weights (``weight_type=QUInt8``: weight zero points; per channel they are
  symmetric, zero point 128);
- ``qdq-u8w-tensor``, ``qoperator-u8w-tensor``: u8 weights per tensor (``weight_type=QUInt8``,
  ``per_channel=False``; onnxruntime's defaults until 1.11): an asymmetric zero point, so
  ``w − zw`` leaves s8;
- ``qdq-a16``: 16-bit activations (``activation_type=QInt16``; A16W8, for accuracy);
- ``qdq-w4``: 4-bit weights (``weight_type=QInt4``; com.microsoft Q/DQ below opset 21);
- ``qdq-contrib``: ``extra_options={"UseQDQContribOps": True}`` (com.microsoft Q/DQ);
- ``qdq-raw``: quantize_static straight on the exported model, without quant_pre_process
  (what a user who skips the recommended pre-processing step gets: no shape inference, none
  of onnxruntime's graph fusions before quantization);
- ``qdq-keepact``: ``extra_options={"QDQKeepRemovableActivations": True}`` (Q/DQ kept around
  Relu and Clip instead of folding them into the producer's output range);
- ``qdq-wpair``: ``extra_options={"AddQDQPairToWeight": True}`` (float weights behind a
  QuantizeLinear / DequantizeLinear pair instead of integer initializers);
- ``qoperator-s8``: QOperator with s8 activations;
- ``qoperator-raw``: QOperator without quant_pre_process;
- ``qdq-compute``: ``op_types_to_quantize=["Conv", "MatMul", "Gemm"]`` (only the compute ops
  and their outputs are quantized; pooling, Add, Concat and the rest stay float);
- ``qdq-trt``: the placement TensorRT's explicit quantization expects: Q/DQ only on the
  inputs of Conv / MatMul / Gemm (``OpTypesToExcludeOutputQuantization``), s8 symmetric
  activations;
- ``nncf-mixed``: NNCF ``preset=MIXED`` (asymmetric activations: per-channel zero points on
  depthwise inputs);
- ``nncf-transformer``: NNCF ``model_type=TRANSFORMER`` (MIXED plus SmoothQuant's scales);
- ``qdq-all``: every op type of the model quantized, as onnxruntime's ``get_qdq_config``
  ("a configuration suitable that quantizes the entire model to integer precision") asks
  ``quantize_static`` for: ``op_types_to_quantize`` = all op types of the model and
  ``ForceQuantizeNoInputCheck`` (Q/DQ around Softmax, LayerNormalization, Reshape, Sigmoid, …);
- ``dynamic``: ``quantize_dynamic`` (DynamicQuantizeLinear, MatMulInteger / ConvInteger; no
  calibration). Onnxruntime runs it on its own integer kernels, which sum u8·s8 pairs in
  int16 on CPUs without VNNI (not exact there): the sweep's reference is its exact form
  (exact.py);
- ``dynamic-u8w``: quantize_dynamic with ``weight_type=QUInt8`` (its default until
  onnxruntime 1.11, in many scripts still): per-tensor asymmetric u8 weights;
  ``dynamic-u8w-channel`` with ``per_channel=True`` too (zero points per column).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx

QUANTIZERS = ("qdq", "qoperator", "nncf")
#: variant -> (base quantizer, changed options) (module docstring)
VARIANTS: dict[str, tuple[str, dict[str, object]]] = {
    "qdq-default": ("qdq", {"activation_type": "QInt8", "per_channel": False}),
    "qdq-dedicated": ("qdq", {"extra_options": {"DedicatedQDQPair": True}}),
    "qdq-s8": ("qdq", {"activation_type": "QInt8",
                       "extra_options": {"ActivationSymmetric": True}}),
    "qdq-tensor": ("qdq", {"per_channel": False, "reduce_range": True}),
    "qdq-u8w": ("qdq", {"weight_type": "QUInt8"}),
    "qdq-u8w-tensor": ("qdq", {"weight_type": "QUInt8", "per_channel": False}),
    "qoperator-u8w-tensor": ("qoperator", {"weight_type": "QUInt8", "per_channel": False}),
    "qdq-compute": ("qdq", {"op_types_to_quantize": ["Conv", "MatMul", "Gemm"]}),
    "qdq-trt": ("qdq", {"op_types_to_quantize": ["Conv", "MatMul", "Gemm"],
                        "activation_type": "QInt8",
                        "extra_options": {"ActivationSymmetric": True,
                                          "OpTypesToExcludeOutputQuantization":
                                              ["Conv", "MatMul", "Gemm"]}}),
    "qdq-a16": ("qdq", {"activation_type": "QInt16"}),
    "qdq-w4": ("qdq", {"weight_type": "QInt4"}),
    "qdq-contrib": ("qdq", {"extra_options": {"UseQDQContribOps": True}}),
    "qdq-raw": ("qdq", {"pre_process": False}),
    "qdq-keepact": ("qdq", {"extra_options": {"QDQKeepRemovableActivations": True}}),
    "qdq-wpair": ("qdq", {"extra_options": {"AddQDQPairToWeight": True}}),
    "qdq-all": ("qdq", {"op_types_to_quantize": "all",
                        "extra_options": {"ForceQuantizeNoInputCheck": True}}),
    "qoperator-s8": ("qoperator", {"activation_type": "QInt8"}),
    "qoperator-raw": ("qoperator", {"pre_process": False}),
    "nncf-mixed": ("nncf", {"preset": "MIXED"}),
    "nncf-transformer": ("nncf", {"model_type": "TRANSFORMER"}),
    "dynamic": ("dynamic", {}),
    "dynamic-u8w": ("dynamic", {"weight_type": "QUInt8"}),
    "dynamic-u8w-channel": ("dynamic", {"weight_type": "QUInt8", "per_channel": True}),
}
# DequantizeLinear has an `axis` (per-channel scales) from this opset on.
PER_CHANNEL_QDQ_OPSET = 13


def pre_process(src: Path, dst: Path) -> list[str]:
    """onnxruntime's quant_pre_process from ``src`` to ``dst``; returns notes on fallbacks."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    try:
        quant_pre_process(str(src), str(dst))
        return []
    except Exception as exc:  # noqa: BLE001 - any failure of the default path is recorded
        first = f"{type(exc).__name__}: {exc}".strip()
    quant_pre_process(str(src), str(dst), skip_symbolic_shape=True)
    return [f"quant_pre_process raised {first[:300]!r}; reran with skip_symbolic_shape=True"]


class _Reader:
    """A CalibrationDataReader over a fixed list of feeds."""

    def __init__(self, feeds: Sequence[dict[str, np.ndarray]]) -> None:
        self._feeds = list(feeds)
        self._it = iter(self._feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)

    def rewind(self) -> None:
        self._it = iter(self._feeds)


def quantize_ort(float_model: onnx.ModelProto, calibration: Sequence[dict[str, np.ndarray]],
                 fmt: str, options: dict[str, object] | None = None
                 ) -> tuple[onnx.ModelProto, list[str]]:
    """quant_pre_process + quantize_static in ``fmt`` ('qdq' or 'qoperator'); ``options``
    change quantize_static's keyword arguments (QuantType members by name), but
    ``pre_process=False`` skips quant_pre_process."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    # in the temporary directory: onnxruntime's symbolic shape inference, when it gives up,
    # saves "sym_shape_infer_temp.onnx" and a uuid-named external-data file (113 MB for
    # torchvision's Swin-V2-T) into the working directory (symbolic_shape_infer.py,
    # infer_shapes)
    with tempfile.TemporaryDirectory(prefix="qfuse-realzoo-") as tmp, contextlib.chdir(tmp):
        work = Path(tmp)
        onnx.save(float_model, work / "float.onnx")
        options = dict(options or {})
        if options.pop("pre_process", True):
            notes = pre_process(work / "float.onnx", work / "pre.onnx")
        else:
            notes = ["quant_pre_process skipped"]
            onnx.save(float_model, work / "pre.onnx")
        reader = type("Reader", (_Reader, CalibrationDataReader), {})(calibration)
        kwargs = {
            "quant_format": QuantFormat.QDQ if fmt == "qdq" else QuantFormat.QOperator,
            "per_channel": True,
            "reduce_range": False,
            "activation_type": QuantType.QUInt8,
            "weight_type": QuantType.QInt8,
            "calibrate_method": CalibrationMethod.MinMax,
        }
        for key, value in options.items():
            kwargs[key] = (QuantType[value] if key.endswith("_type")
                           else dict(value) if isinstance(value, dict) else value)
        if kwargs.get("op_types_to_quantize") == "all":  # get_qdq_config's every op type
            kwargs["op_types_to_quantize"] = sorted(
                {n.op_type for n in onnx.load(work / "pre.onnx").graph.node})
        quantize_static(str(work / "pre.onnx"), str(work / "q.onnx"), reader, **kwargs)
        problem = _invalid(work / "q.onnx")
        opset = _opset(float_model)
        if problem and opset < PER_CHANNEL_QDQ_OPSET:
            # quantize_static keeps opsets 10..20 and writes per-channel DequantizeLinear with
            # an `axis`, which exists from opset 13 on: the user's fix is to convert first.
            notes.append(f"quantize_static wrote an invalid model at opset {opset} "
                         f"({problem[:200]!r}); converted the model to opset "
                         f"{PER_CHANNEL_QDQ_OPSET} with onnx.version_converter and reran")
            upgraded = onnx.version_converter.convert_version(onnx.load(work / "pre.onnx"),
                                                              PER_CHANNEL_QDQ_OPSET)
            onnx.save(upgraded, work / "pre13.onnx")
            reader.rewind()
            quantize_static(str(work / "pre13.onnx"), str(work / "q.onnx"), reader, **kwargs)
            problem = _invalid(work / "q.onnx")
        if problem:
            raise RuntimeError(f"quantize_static wrote a model onnxruntime cannot load: {problem}")
        return onnx.load(work / "q.onnx"), notes


def _opset(model: onnx.ModelProto) -> int:
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def _invalid(path: Path) -> str | None:
    """Why onnxruntime refuses to load the model at ``path`` (None if it loads)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - the message is the answer
        return str(exc)
    return None


def quantize_nncf(float_model: onnx.ModelProto, calibration: Sequence[dict[str, np.ndarray]],
                  options: dict[str, object] | None = None
                  ) -> tuple[onnx.ModelProto, list[str]]:
    """nncf.quantize with NNCF's defaults on the ONNX backend (``options``: ``preset`` /
    ``model_type`` by member name)."""
    import nncf

    kwargs: dict[str, object] = {}
    for key, value in (options or {}).items():
        kind = {"preset": nncf.QuantizationPreset, "model_type": nncf.ModelType}[key]
        kwargs[key] = kind[str(value)]
    dataset = nncf.Dataset(list(calibration))
    quantized = nncf.quantize(float_model, dataset, subset_size=len(calibration), **kwargs)
    return quantized, []


def quantize_dynamic(float_model: onnx.ModelProto, options: dict[str, object] | None = None
                     ) -> tuple[onnx.ModelProto, list[str]]:
    """quant_pre_process + onnxruntime's quantize_dynamic (s8 weights, its defaults;
    ``options`` change its keyword arguments, QuantType members by name)."""
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization import quantize_dynamic as ort_quantize_dynamic

    with tempfile.TemporaryDirectory(prefix="qfuse-realzoo-") as tmp:
        work = Path(tmp)
        onnx.save(float_model, work / "float.onnx")
        notes = pre_process(work / "float.onnx", work / "pre.onnx")
        kwargs: dict[str, object] = {"weight_type": QuantType.QInt8}
        for key, value in (options or {}).items():
            kwargs[key] = QuantType[str(value)] if key.endswith("_type") else value
        ort_quantize_dynamic(str(work / "pre.onnx"), str(work / "q.onnx"), **kwargs)
        return onnx.load(work / "q.onnx"), notes


def quantize(float_model: onnx.ModelProto, calibration: Sequence[dict[str, np.ndarray]],
             quantizer: str) -> tuple[onnx.ModelProto, list[str]]:
    """The model quantized by ``quantizer`` (one of QUANTIZERS) and notes on what happened."""
    base, options = VARIANTS.get(quantizer, (quantizer, {}))
    if base in ("qdq", "qoperator"):
        return quantize_ort(float_model, calibration, base, options)
    if base == "nncf":
        return quantize_nncf(float_model, calibration, options)
    if base == "dynamic":
        return quantize_dynamic(float_model, options)
    raise ValueError(f"unknown quantizer {quantizer!r}; choose one of "
                     f"{', '.join((*QUANTIZERS, *VARIANTS))}")
