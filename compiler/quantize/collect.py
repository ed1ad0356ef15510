"""One calibration pass: run the float model over the batches and histogram the placed tensors.

The float model runs in ONNX Runtime with every tensor to observe added as a graph output (ORT
keeps graph outputs through its graph optimizations). Each scale group (placement.py) has one
histogram fed by all its tensors, so a group's range is the union of its members' values.
Tensors quantized per channel (placement.py, depthwise inputs) also get their per-channel
minima and maxima (``ChannelRange``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from qfuse.compiler.errors import InputError
from qfuse.compiler.quantize import data as calib
from qfuse.compiler.quantize.histogram import DEFAULT_BINS, Histogram

log = logging.getLogger(__name__)
SYMBOLIC_BATCH = 16  # samples per run when the model's batch axis is symbolic


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {t.name for t in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in inits]


def model_batch(model: onnx.ModelProto) -> int | None:
    """The fixed first dimension shared by the inputs, or None when it is symbolic."""
    dims = set()
    for vi in graph_inputs(model):
        shape = vi.type.tensor_type.shape.dim
        if not shape:
            return None
        dims.add(shape[0].dim_value if shape[0].HasField("dim_value") else None)
    return dims.pop() if len(dims) == 1 else None


def session(model: onnx.ModelProto, outputs: Iterable[str], *,
            optimize: bool = True) -> Any:
    """An ORT session over ``model`` whose graph outputs also include ``outputs``."""
    import onnxruntime as ort

    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    for name in outputs:
        if name not in have:
            m.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
            have.add(name)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if not optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def feeds(model: onnx.ModelProto, chunks: list[dict[str, np.ndarray]], *,
          progress: bool = False, what: str = "calibrating") -> Iterator[dict[str, np.ndarray]]:
    """The calibration batches as float32 feeds, with a progress bar when asked."""
    dims = {vi.name: [d.dim_value if d.HasField("dim_value") else None
                      for d in vi.type.tensor_type.shape.dim] for vi in graph_inputs(model)}
    for chunk in chunks:  # each sample's shape against the model's (batch axis aside)
        for name, array in chunk.items():
            want = dims.get(name)
            if want and (array.ndim != len(want) or any(
                    w is not None and w != a for w, a in zip(want[1:], array.shape[1:],
                                                             strict=True))):
                raise InputError(f"calibration data for input '{name}' has shape "
                                 f"{array.shape}; the model wants (N, "
                                 f"{', '.join(str(d) for d in want[1:])}) batched on axis 0")
    batch = model_batch(model)
    total = calib.count(chunks, batch or SYMBOLIC_BATCH)
    it: Iterable[dict[str, np.ndarray]] = calib.batches(chunks, batch or SYMBOLIC_BATCH)
    if progress:
        try:
            from tqdm import tqdm

            it = tqdm(it, total=total, desc=what, unit="batch")
        except ImportError:  # tqdm is optional (pip install qfuse[quantize])
            log.info("%s: %d batches", what, total)
    types = {vi.name: helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
             for vi in graph_inputs(model)}
    for f in it:
        yield {k: np.asarray(v, types.get(k, np.float32)) for k, v in f.items()}


class ChannelRange:
    """The running minimum and maximum of each channel (along ``axis``) of a tensor."""

    def __init__(self, axis: int) -> None:
        self.axis = axis
        self.min: np.ndarray | None = None
        self.max: np.ndarray | None = None

    def add(self, values: np.ndarray) -> None:
        x = np.moveaxis(np.asarray(values, np.float64), self.axis, 0)
        x = x.reshape(x.shape[0], -1)
        finite = np.isfinite(x)
        lo = np.where(finite, x, np.inf).min(axis=1)
        hi = np.where(finite, x, -np.inf).max(axis=1)
        self.min = lo if self.min is None else np.minimum(self.min, lo)
        self.max = hi if self.max is None else np.maximum(self.max, hi)


def collect(model: onnx.ModelProto, groups: dict[int, list[str]],
            chunks: list[dict[str, np.ndarray]], *, bins: int = DEFAULT_BINS,
            progress: bool = False, channels: dict[str, ChannelRange] | None = None
            ) -> dict[int, Histogram]:
    """One histogram per scale group over every calibration batch; ``channels`` (tensor →
    its ChannelRange) are filled in the same pass."""
    channels = channels or {}
    inputs = {vi.name for vi in graph_inputs(model)}
    observed = sorted({t for members in groups.values() for t in members} - inputs)
    sess = session(model, observed)
    hists = {gid: Histogram(bins) for gid in groups}
    n = 0
    for feed in feeds(model, chunks, progress=progress):
        # run(None) would return the graph outputs: with nothing to observe, run nothing
        values = dict(zip(observed, sess.run(observed, feed), strict=True)) if observed else {}
        values.update({k: v for k, v in feed.items() if k in inputs})
        for gid, members in groups.items():
            for t in members:
                hists[gid].add(values[t])
        for t, rng in channels.items():
            rng.add(values[t])
        n += 1
    if n == 0:
        raise InputError("the calibration data gave no batch of the model's batch size "
                         f"{model_batch(model)}")
    return hists
