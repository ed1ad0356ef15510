"""Write the quantized model: QDQ (QuantizeLinear → DequantizeLinear) or OpenVINO FakeQuantize.

QDQ, as ONNX Runtime's quantize_static writes it (ONNX spec, QuantizeLinear /
DequantizeLinear, opset >= 13): a quantized activation ``t`` gets ``Q(t) → DQ`` right after its
producer, and every reader of ``t`` reads the DQ's output (graph outputs keep the float
``t``); a weight becomes an s8 initializer → ``DequantizeLinear(axis)`` with zero point 0.

FakeQuantize (domain ``org.openvinotoolkit``, as NNCF exports it and
compiler/onnx_import/convert_quant.py reads it): activations ``FQ(t, il, ih, ol, oh,
levels=256)`` with ``il = ol = s·(qmin - zp)`` and ``ih = oh = s·(qmax - zp)`` — the same grid
as the Q/DQ pair (per-channel scales: a scale vector on the Q/DQ pair with ``axis``, bounds
shaped to broadcast along the axis in FakeQuantize); weights ``FQ(w, -127·s, 127·s, -127·s, 127·s, levels=255)`` on the float
weight, bounds shaped to broadcast along the channel axis.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

OPENVINO_DOMAIN = "org.openvinotoolkit"
WEIGHT_QMAX = 127  # s8 symmetric, narrow range [-127, 127] (as quantize_static's weights)


@dataclass(frozen=True)
class ActParams:
    """An activation's quantizer: ``scale`` a float, or with ``axis`` one float32 scale per
    channel along that axis (the zero point is common)."""

    scale: float | np.ndarray
    zero_point: int
    dtype: str  # "u8" | "s8"
    axis: int | None = None

    @property
    def qrange(self) -> tuple[int, int]:
        return (0, 255) if self.dtype == "u8" else (-128, 127)


def quantize_weight(w: np.ndarray, axis: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(s8 values, float32 scales): ``q = round_half_even(w / s)``, ``s = max|w| / 127`` per
    channel along ``axis`` (per tensor when None). A channel whose scale would be below the
    smallest normal float32 (all zero, or pruned to values under ~1.5e-36) is written as zeros
    with scale 1, as onnxruntime's ``compute_scale_zp`` does (quantization/quant_utils.py):
    the compiler cannot compute with a subnormal scale exactly and leaves such weights float."""
    w = w.astype(np.float32)
    if axis is None:
        amax = np.asarray(np.abs(w).max(), np.float32).reshape(1)
    else:
        amax = np.abs(np.moveaxis(w, axis, 0)).reshape(w.shape[axis], -1).max(axis=1)
    scale = (amax / np.float32(WEIGHT_QMAX)).astype(np.float32)
    scale = np.where(scale >= np.finfo(np.float32).tiny, scale, np.float32(1.0))
    shape = [1] * w.ndim
    if axis is not None:
        shape[axis] = -1
    q = np.clip(np.rint(w / scale.reshape(shape)), -WEIGHT_QMAX, WEIGHT_QMAX).astype(np.int8)
    return q, scale


class Names:
    """Fresh names in ``model``: ``names(base)`` is ``base`` or ``base_1``, ``base_2``, ...,
    whichever no initializer, graph input, node output or node has yet (then taken)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        g = model.graph
        self.used = {t.name for t in g.initializer} | {v.name for v in g.input} | {
            o for n in g.node for o in n.output} | {n.name for n in g.node}

    def __call__(self, base: str) -> str:
        name, i = base, 1
        while name in self.used:
            name, i = f"{base}_{i}", i + 1
        self.used.add(name)
        return name


def write(model: onnx.ModelProto, activations: dict[str, ActParams],
          weights: dict[str, int | None], fmt: str = "qdq",
          keep_float: frozenset[str] | set[str] = frozenset()) -> onnx.ModelProto:
    """A copy of ``model`` with the quantizers inserted (module docstring); the nodes named
    in ``keep_float`` go on reading the float values."""
    if fmt not in ("qdq", "fakequantize"):
        raise ValueError(f"unknown format {fmt!r}; choose qdq or fakequantize")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    names = Names(out)
    inits = {t.name: t for t in g.initializer}
    new_inits: list[onnx.TensorProto] = []
    rename: dict[str, str] = {}  # original value → what its readers read now
    head: list[onnx.NodeProto] = []  # weight dequantizers, graph-input quantizers
    after: dict[str, list[onnx.NodeProto]] = {}  # value → quantizer nodes after its producer

    def const(base: str, value: np.ndarray) -> str:
        name = names(base)
        new_inits.append(numpy_helper.from_array(value, name))
        return name

    for w_name, axis in weights.items():
        w = numpy_helper.to_array(inits[w_name])
        q, scale = quantize_weight(w, axis)
        deq = names(f"{w_name}_dequantized")
        if fmt == "qdq":
            args = [const(f"{w_name}_quantized", q), const(f"{w_name}_scale",
                    scale if axis is not None else scale.reshape(())),
                    const(f"{w_name}_zero_point", np.zeros(scale.shape if axis is not None
                                                            else (), np.int8))]
            attrs = {"axis": axis} if axis is not None else {}
            head.append(helper.make_node("DequantizeLinear", args, [deq],
                                         names(f"{w_name}_DequantizeLinear"), **attrs))
        else:
            shape = [1] * w.ndim
            if axis is not None:
                shape[axis] = -1
            bound = (scale * WEIGHT_QMAX).reshape(shape).astype(np.float32)
            lo, hi = const(f"{w_name}_low", -bound), const(f"{w_name}_high", bound)
            head.append(helper.make_node("FakeQuantize", [w_name, lo, hi, lo, hi], [deq],
                                         names(f"{w_name}_FakeQuantize"), levels=255,
                                         domain=OPENVINO_DOMAIN))
        rename[w_name] = deq

    graph_inputs = {v.name for v in g.input}
    for t, p in activations.items():
        deq = names(f"{t}_dequantized")
        s = np.asarray(p.scale, np.float32)
        if fmt == "qdq":
            scale = const(f"{t}_scale", s)
            zp = const(f"{t}_zero_point", np.full(s.shape, p.zero_point,
                                                  np.uint8 if p.dtype == "u8" else np.int8))
            qv = names(f"{t}_quantized")
            attrs = {"axis": p.axis} if p.axis is not None else {}
            nodes = [helper.make_node("QuantizeLinear", [t, scale, zp], [qv],
                                      names(f"{t}_QuantizeLinear"), **attrs),
                     helper.make_node("DequantizeLinear", [qv, scale, zp], [deq],
                                      names(f"{t}_DequantizeLinear"), **attrs)]
        else:
            qmin, qmax = p.qrange
            if p.axis is not None:  # bounds broadcast along the axis: (1, C, 1, ...)
                s = s.reshape([-1] + [1] * (_rank(g, t) - 1 - p.axis))
            lo = const(f"{t}_low", (s * np.float32(qmin - p.zero_point)).astype(np.float32))
            hi = const(f"{t}_high", (s * np.float32(qmax - p.zero_point)).astype(np.float32))
            nodes = [helper.make_node("FakeQuantize", [t, lo, hi, lo, hi], [deq],
                                      names(f"{t}_FakeQuantize"), levels=256,
                                      domain=OPENVINO_DOMAIN)]
        (head if t in graph_inputs else after.setdefault(t, [])).extend(nodes)
        rename[t] = deq

    ordered = list(head)
    for node in g.node:
        for i, v in enumerate(node.input):
            if v in rename and node.name not in keep_float:
                node.input[i] = rename[v]
        ordered.append(node)
        for o in node.output:
            ordered.extend(after.get(o, []))
    del g.node[:]
    g.node.extend(ordered)
    used = {v for n in g.node for v in n.input}
    keep = [t for t in g.initializer if t.name in used or t.name in graph_inputs]
    del g.initializer[:]
    g.initializer.extend(keep + new_inits)
    if fmt == "fakequantize" and not any(o.domain == OPENVINO_DOMAIN for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid(OPENVINO_DOMAIN, 1))
    return out


def _rank(graph: onnx.GraphProto, tensor: str) -> int:
    """The rank of ``tensor``: from the graph's value infos, else from the weights of a Conv
    reading it (a conv's input has its weights' rank)."""
    for vi in list(graph.value_info) + list(graph.input) + list(graph.output):
        if vi.name == tensor and len(vi.type.tensor_type.shape.dim):
            return len(vi.type.tensor_type.shape.dim)
    inits = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Conv" and node.input[0] == tensor and node.input[1] in inits:
            return len(inits[node.input[1]].dims)
    raise ValueError(f"the rank of '{tensor}' is unknown: FakeQuantize bounds per channel "
                     f"need it")


def ensure_opset(model: onnx.ModelProto, minimum: int = 13) -> onnx.ModelProto:
    """Per-axis QuantizeLinear / DequantizeLinear need opset 13: convert older models."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None or opset >= minimum:
        return model
    from onnx import version_converter

    return version_converter.convert_version(model, minimum)


__all__ = ["ActParams", "ensure_opset", "quantize_weight", "write"]
