"""``qfuse quantize --report``: per-layer SQNR of the quantized model against the float one.

After DNNLOWP's ``measure_quantization_error`` (a float shadow of each int8 operator, pytorch
caffe2/quantization/server/dnnlowp_op.h): both models run on the calibration batches in ONNX
Runtime — the quantized one with graph optimizations off, so its QuantizeLinear /
DequantizeLinear pairs run as written (exact ONNX semantics, no int8 kernels) — and for every
quantized tensor ``t`` the float model's ``t`` is compared with the quantized model's
dequantized ``t``. The error accumulates everything upstream, as in the deployed model::

    SQNR = 10·log10(Σ t² / Σ (t_q - t)²)   over all calibration batches,

worst (lowest) first, so a user sees which layers to ``--exclude``. The row names the node
producing ``t`` (the layer whose output is quantized there).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx

from qfuse.compiler.quantize.collect import feeds, session


def _pairs(quantized: onnx.ModelProto) -> dict[str, str]:
    """float tensor → the dequantized tensor of the quantized model that replaces it."""
    producer = {o: n for n in quantized.graph.node for o in n.output}
    pairs = {}
    for node in quantized.graph.node:
        if node.op_type != "DequantizeLinear":
            continue
        q = producer.get(node.input[0])
        if q is not None and q.op_type == "QuantizeLinear":
            pairs[q.input[0]] = node.output[0]
    return pairs


def sqnr_report(float_model: onnx.ModelProto, quantized: onnx.ModelProto,
                chunks: list[dict[str, np.ndarray]], *,
                progress: bool = False) -> list[dict[str, Any]]:
    """One row per quantized activation: layer, op, tensor, SQNR dB, relative L2, max error."""
    pairs = _pairs(quantized)
    inputs = {i.name for i in float_model.graph.input}
    names = [t for t in pairs if t not in inputs]
    ref_sess = session(float_model, names)
    q_sess = session(quantized, [pairs[t] for t in pairs], optimize=False)
    signal = dict.fromkeys(pairs, 0.0)
    noise = dict.fromkeys(pairs, 0.0)
    worst = dict.fromkeys(pairs, 0.0)
    for feed in feeds(float_model, chunks, progress=progress, what="measuring"):
        ref = dict(zip(names, ref_sess.run(names, feed), strict=True))
        ref.update({k: v for k, v in feed.items() if k in pairs})
        got = dict(zip(pairs, q_sess.run([pairs[t] for t in pairs], feed), strict=True))
        for t in pairs:
            r = ref[t].astype(np.float64)
            e = got[t].astype(np.float64) - r
            signal[t] += float(np.sum(r * r))
            noise[t] += float(np.sum(e * e))
            worst[t] = max(worst[t], float(np.max(np.abs(e))) if e.size else 0.0)
    producer = {o: n for n in float_model.graph.node for o in n.output}
    rows = []
    for t in pairs:
        p = producer.get(t)
        sqnr = math.inf if noise[t] == 0 else (
            -math.inf if signal[t] == 0 else 10 * math.log10(signal[t] / noise[t]))
        rows.append({"layer": p.name if p is not None else t,
                     "op": p.op_type if p is not None else "input", "tensor": t,
                     "sqnr_db": sqnr,
                     "relative_l2": math.sqrt(noise[t] / signal[t]) if signal[t] else math.inf,
                     "max_abs_error": worst[t]})
    rows.sort(key=lambda r: (r["sqnr_db"], r["tensor"]))
    return rows


def format_report(rows: list[dict[str, Any]]) -> str:
    lw = max([len("layer")] + [len(f"{r['layer']} ({r['op']})") for r in rows])
    title = "per-layer SQNR of the quantized model vs float on the calibration data (worst first)"
    header = f"{'layer':<{lw}}  {'SQNR dB':>8}  {'rel L2':>9}  {'max |err|':>9}  tensor"
    lines = [title, header]
    for r in rows:
        sqnr = "inf" if math.isinf(r["sqnr_db"]) else f"{r['sqnr_db']:.2f}"
        lines.append(f"{r['layer'] + ' (' + r['op'] + ')':<{lw}}  {sqnr:>8}  "
                     f"{r['relative_l2']:>9.3g}  {r['max_abs_error']:>9.3g}  {r['tensor']}")
    return "\n".join(lines)
