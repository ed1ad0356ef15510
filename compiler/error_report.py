"""``qfuse inspect MODEL --error``: per-layer quantization error against a float shadow.

After Caffe2 DNNLOWP's ``measure_quantization_error`` (Caffe2 DNNLOWP), which runs a float32 shadow of
every int8 operator: here the shadow is the whole *float model* — the imported graph with every
QuantizeLinear -> DequantizeLinear pair removed (the DQ's readers read the Q's float input) and
the quantized weights left as ``DequantizeLinear(w_q)``, i.e. dequantized — evaluated by the
reference interpreter on the same inputs as the quantized model.

For each QuantizeLinear ``q`` of the quantized model (the "layer" is the node producing its
input) the actual value is ``dequantize(q)`` from the quantized model and the reference the
shadow's value of the same tensor name as ``q``'s input, so the error accumulates everything
upstream (as in the deployed model), not just this layer's rounding::

    stats = quantization_error(shadow[q.input], (q_out - zp) * s, scale=s)

reported as L2, relative L2, SQNR (dB) and max error in LSB of ``s``, sorted worst (lowest
SQNR) first. JSON has no infinity: SQNR of an exact tensor is reported as null.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from qfuse.ir.graph import Graph, Node
from qfuse.ir.ops import Op
from qfuse.runtime.numerics import dequantize, quantization_error
from qfuse.runtime.reference import evaluate

__all__ = ["error_report", "float_shadow", "format_text", "json_payload", "main_error", "relu_folded"]


def relu_folded(graph: Graph, q: Node) -> bool:
    """True when ``q``'s real range starts at exactly 0 (zero point = qmin).

    onnxruntime's quantize_static removes Relu / Clip and lets the quantizer's saturation do
    them (its MinMax calibration always includes 0 in a range, so a range starting at 0 means
    the values were >= 0 — a ReLU, or data that never goes negative, where a ReLU is a no-op).
    """
    _, zp, _ = _quant(graph, q)
    return bool(np.all(np.asarray(zp, np.int64) == q.attrs.dtype.range[0]))


def float_shadow(graph: Graph) -> Graph:
    """A copy of ``graph`` with every Q -> DQ pair removed (DQ readers read Q's input).

    Where the Q had a ReLU folded into it (``relu_folded``) the readers read ``Relu(x)`` instead,
    so the shadow keeps the float model's ReLUs; a folded Clip(0, 6) comes back as a ReLU only.
    """
    shadow = graph.copy()
    for q in [n for n in shadow.topo_order() if n.op is Op.QUANTIZE_LINEAR]:
        x = q.inputs[0]
        readers = [r for r, _ in shadow.consumers(q.outputs[0])
                   if r.op is Op.DEQUANTIZE_LINEAR]
        if readers and relu_folded(shadow, q):
            relu = shadow.add_node(Op.RELU, [x], [shadow.unique_name(f"{x}_shadow_relu")])
            x = relu.outputs[0]
        for reader in readers:
            _bypass(shadow, reader, x)
        if not shadow.uses(q.outputs[0]):
            shadow.remove_node(q)
    return shadow


def _bypass(graph: Graph, dq: Node, value: str) -> None:
    graph.replace_all_uses(dq.outputs[0], value)
    graph.remove_node(dq)


def _quant(graph: Graph, q: Node) -> tuple[np.ndarray, np.ndarray, int | None]:
    scale = graph.constant(q.inputs[1])
    zp_name = q.inputs[2] if len(q.inputs) > 2 else ""
    zp = graph.constant(zp_name) if zp_name else np.zeros((), np.int64)
    if scale is None or zp is None:
        raise ValueError(f"node {q}: scale and zero point must be constants")
    axis = q.attrs.axis if scale.size > 1 else None
    return scale, zp, axis


def error_report(graph: Graph, feeds: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    """One row per quantized tensor, worst (lowest SQNR) first."""
    quantized = evaluate(graph, feeds, keep=True)
    shadow = evaluate(float_shadow(graph), feeds, keep=True)
    rows = []
    for q in graph.topo_order():
        if q.op is not Op.QUANTIZE_LINEAR:
            continue
        scale, zp, axis = _quant(graph, q)
        actual = dequantize(quantized[q.outputs[0]], scale, zp.astype(np.int64), axis=axis)
        ref = shadow.get(q.inputs[0], graph.constant(q.inputs[0]))
        if relu_folded(graph, q):
            ref = np.maximum(ref, np.float32(0))
        producer = graph.producer(q.inputs[0])
        lsb = scale if axis is None else scale.reshape(
            [-1 if i == axis % actual.ndim else 1 for i in range(actual.ndim)])
        stats = quantization_error(ref, actual, scale=lsb)
        rows.append({
            "tensor": q.outputs[0],
            "layer": producer.name if producer is not None else q.inputs[0],
            "op": producer.op.value if producer is not None else "input",
            "elements": stats.elements,
            "l2": stats.l2_error,
            "relative_l2": stats.relative_l2,
            "sqnr_db": stats.sqnr_db,
            "max_error_lsb": stats.max_error_lsb,
        })
    rows.sort(key=lambda r: (r["sqnr_db"], r["tensor"]))
    return rows


def _finite(v: float | None) -> float | None:
    return None if v is None or math.isnan(v) or math.isinf(v) else v


def json_payload(rows: list[dict[str, Any]], inputs: str) -> dict[str, Any]:
    clean = [{k: (_finite(v) if isinstance(v, float) else v) for k, v in r.items()}
             for r in rows]
    return {"inputs": inputs, "sort": "sqnr_db ascending (worst first)", "layers": clean}


def format_text(rows: list[dict[str, Any]], inputs: str) -> str:
    lw = max([len("layer")] + [len(f"{r['layer']} ({r['op']})") for r in rows])
    tw = max([len("tensor")] + [len(r["tensor"]) for r in rows])
    header = (f"{'layer':<{lw}}  {'tensor':<{tw}}  {'SQNR dB':>8}  {'rel L2':>9}  "
              f"{'L2':>9}  {'max LSB':>7}")
    lines = [f"quantization error against the float shadow; inputs: {inputs}", header]
    for r in rows:
        sqnr = "inf" if math.isinf(r["sqnr_db"]) else f"{r['sqnr_db']:.2f}"
        lines.append(f"{r['layer'] + ' (' + r['op'] + ')':<{lw}}  {r['tensor']:<{tw}}  "
                     f"{sqnr:>8}  {r['relative_l2']:>9.3g}  {r['l2']:>9.3g}  "
                     f"{r['max_error_lsb']:>7.2f}")
    return "\n".join(lines)


def main_error(args: Any) -> int:
    """``qfuse inspect MODEL --error [--json] [--inputs IN.npz]``."""
    from qfuse.compiler.api import compile_model
    from qfuse.compiler.cli_compare import load_feeds
    from qfuse.compiler.cli_output import emit

    model = compile_model(args.model, mode="reference")
    feeds = load_feeds(model, args.inputs)
    inputs = str(args.inputs) if args.inputs else "random (seed 0)"
    rows = error_report(model.graph, feeds)
    emit(args.json, json_payload(rows, inputs), lambda: format_text(rows, inputs))
    return 0
