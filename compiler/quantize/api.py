"""``qfuse.quantize``: float ONNX model + calibration data → int8 model placed for the compiler.

    import qfuse
    q = qfuse.quantize("model.onnx", "calib.npz", "model.int8.onnx", method="minmax")

Steps: placement.py decides which tensors get a quantizer (and which share a scale);
collect.py runs the float model once over the calibration batches and fills one histogram per
scale group; methods.py turns each histogram into a range and (scale, zero point); writer.py
writes QDQ or FakeQuantize. With per-channel weights (the default), inputs of depthwise
convolutions get one scale per channel and a common zero point (placement.py,
methods.channel_scales). The default method is minmax: on the real-model zoo percentile
is closer to float on the detector (min cosine 0.872 against 0.835) but further on PP-LCNet
(0.974 against 0.991) and drops YOLOv8n's detection agreement from 0.949 to 0.824; with
depthwise inputs per tensor it clipped outliers the PP-OCRv4 recognizer's attention needs
(0.835 against 0.942); l2 and kl are not better than minmax everywhere either (README,
"Quantizing a float model"). Activations: u8 asymmetric by default
(``activations="s8"``, ``symmetric=True`` for the others); weights: s8 symmetric per output
channel.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from qfuse.compiler.errors import InputError
from qfuse.compiler.files import regular_file
from qfuse.compiler.onnx_import.loading import read_proto
from qfuse.compiler.quantize import bias_correction
from qfuse.compiler.quantize import data as calib
from qfuse.compiler.quantize.collect import ChannelRange, collect, graph_inputs
from qfuse.compiler.quantize.histogram import DEFAULT_BINS, Histogram
from qfuse.compiler.quantize.methods import (
    METHODS,
    channel_scales,
    choose_qparams,
    select_range,
)
from qfuse.compiler.quantize.placement import Placement, place
from qfuse.compiler.quantize.prepare import (
    constants_to_initializers,
    drop_identity_arithmetic,
    fold_batchnorm,
    fold_bias_add,
    scale_after_matmul,
)
from qfuse.compiler.quantize.writer import ActParams, ensure_opset, write

log = logging.getLogger(__name__)
ModelLike = onnx.ModelProto | str | os.PathLike


def load_model(model: ModelLike) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    path = regular_file(model, "model")
    return read_proto(path)


@dataclass
class Quantized:
    """What a quantization run made: the written model, its QDQ twin (for the report; the
    same model when the format is QDQ), the prepared float model and the calibration data."""

    model: onnx.ModelProto
    qdq: onnx.ModelProto
    float_model: onnx.ModelProto
    calibration: list[dict[str, np.ndarray]]


def quantize(
    model: ModelLike,
    calibration: calib.CalibrationData,
    output: str | os.PathLike | None = None,
    *,
    method: str = "minmax",
    per_channel: bool = True,
    activations: str = "u8",
    symmetric: bool = False,
    format: str = "qdq",
    exclude: list[str] | tuple[str, ...] = (),
    percentile: float = 0.9999,
    bins: int = DEFAULT_BINS,
    progress: bool = False,
    correct_bias: bool = False,
) -> onnx.ModelProto:
    """Quantize the float ``model`` on ``calibration`` data; write it to ``output`` if given.

    ``calibration``: an .npz (arrays keyed by input name, batched on the first axis), a folder
    of .npz / .npy files, a mapping or a list of mappings. ``method``: minmax | percentile |
    l2 | kl (methods.py). ``per_channel``: weights per output channel and inputs of depthwise
    convolutions per channel (placement.py); False: one scale per tensor everywhere.
    ``percentile``: the fraction of values the percentile method keeps.
    ``format``: qdq | fakequantize. ``exclude``: node names left in float.
    ``correct_bias``: subtract each layer's mean output error from its weights' quantization,
    measured on the calibration data, from its bias (bias_correction.py).
    """
    return run(model, calibration, output, method=method, per_channel=per_channel,
               activations=activations, symmetric=symmetric, format=format, exclude=exclude,
               percentile=percentile, bins=bins, progress=progress,
               correct_bias=correct_bias).model


def run(
    model: ModelLike,
    calibration: calib.CalibrationData,
    output: str | os.PathLike | None = None,
    *,
    method: str = "minmax",
    per_channel: bool = True,
    activations: str = "u8",
    symmetric: bool = False,
    format: str = "qdq",
    exclude: list[str] | tuple[str, ...] = (),
    percentile: float = 0.9999,
    bins: int = DEFAULT_BINS,
    progress: bool = False,
    statistics: Statistics | None = None,
    correct_bias: bool = False,
) -> Quantized:
    """``quantize`` returning everything it made (the CLI's --report needs it); with
    ``statistics`` (``calibrate``), from those instead of a new calibration pass."""
    if method not in METHODS:
        raise InputError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    if activations not in ("u8", "s8"):
        raise InputError(f"activations must be u8 or s8, got {activations!r}")
    if format not in ("qdq", "fakequantize"):
        raise InputError(f"format must be qdq or fakequantize, got {format!r}")
    if output is not None and not Path(output).resolve().parent.is_dir():
        raise InputError(f"cannot write the quantized model '{output}': its folder does not "
                         f"exist or is not a folder")
    stats = statistics or calibrate(model, calibration, per_channel=per_channel,
                                    exclude=exclude, bins=bins, progress=progress,
                                    correct_bias=correct_bias)
    if correct_bias and stats.corrections is None:
        raise InputError("the statistics were collected without bias correction")
    if stats.per_channel != per_channel or stats.exclude != frozenset(exclude):
        raise InputError("the statistics were collected with other per_channel / exclude")
    float_model, placement, hists = stats.float_model, stats.placement, stats.histograms
    groups = placement.groups()
    qmin, qmax = (0, 255) if activations == "u8" else (-128, 127)
    params = {}
    for gid, members in groups.items():
        lo, hi = select_range(hists[gid], method, symmetric=symmetric, percentile=percentile)
        scale, zp = choose_qparams(lo, hi, qmin, qmax, symmetric)
        log.debug("group %d %s: range [%g, %g] -> scale %g zp %d", gid, members, lo, hi,
                  scale, zp)
        for t in members:
            rng = stats.channels.get(t)
            params[t] = ActParams(scale, zp, activations) if rng is None else ActParams(
                channel_scales(rng.min, rng.max, lo, hi, scale, zp, qmin, qmax), zp,
                activations, rng.axis)
    keep = set(exclude)
    source = float_model  # the float model the report compares against stays as it was
    if correct_bias:
        assert stats.corrections is not None
        source = bias_correction.apply(float_model, stats.corrections)
    qdq = write(source, params, placement.weights, "qdq", keep)
    written = qdq if format == "qdq" else write(source, params, placement.weights, format,
                                                keep)
    written.producer_name = qdq.producer_name = "qfuse quantize"
    onnx.checker.check_model(written)
    if output is not None:
        try:
            onnx.save(written, str(output))
        except OSError as exc:
            raise InputError(f"cannot write the quantized model '{output}': "
                             f"{exc.strerror or exc}") from exc
    return Quantized(written, qdq, float_model, stats.chunks)


@dataclass
class Statistics:
    """What one calibration pass measured (``calibrate``): ``run(..., statistics=...)`` turns
    it into a model per method without running the float model again."""

    float_model: onnx.ModelProto
    placement: Placement
    histograms: dict[int, Histogram]
    chunks: list[dict[str, np.ndarray]]
    per_channel: bool
    exclude: frozenset[str]
    channels: dict[str, ChannelRange]
    corrections: bias_correction.Corrections | None = None


def calibrate(model: ModelLike, calibration: calib.CalibrationData, *,
              per_channel: bool = True, exclude: list[str] | tuple[str, ...] = (),
              bins: int = DEFAULT_BINS, progress: bool = False,
              correct_bias: bool = False) -> Statistics:
    """The prepared float model, its placement, one histogram per scale group and (with
    ``correct_bias``) each layer's bias correction."""
    float_model = fold_batchnorm(fold_bias_add(scale_after_matmul(drop_identity_arithmetic(
        constants_to_initializers(ensure_opset(load_model(model)))))))
    names = {n.name for n in float_model.graph.node}
    unknown = sorted(set(exclude) - names)
    if unknown:
        raise InputError(f"exclude names no node of the model: {unknown}")
    placement = place(float_model, per_channel=per_channel, exclude=set(exclude))
    chunks = calib.load(calibration, [vi.name for vi in graph_inputs(float_model)])
    channels = {t: ChannelRange(axis) for t, axis in placement.channel_axis.items()}
    hists = collect(float_model, placement.groups(), chunks, bins=bins, progress=progress,
                    channels=channels)
    corrections = bias_correction.measure(
        float_model, placement.weights, chunks, exclude=frozenset(exclude),
        progress=progress) if correct_bias else None
    return Statistics(float_model, placement, hists, chunks, per_channel, frozenset(exclude),
                      channels, corrections)
