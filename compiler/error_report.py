"""``qfuse inspect MODEL --error [--float FP32.onnx]``: per-layer quantization error.

After Caffe2 DNNLOWP's ``measure_quantization_error``, which runs a float32 shadow of every
int8 operator. For each QuantizeLinear ``q`` on an activation of the quantized model (the
"layer" is the node producing its input) the actual value is ``dequantize(q)`` — the quantized
model run by the engine that runs the float side unless ``--int8-engine`` says otherwise: with
``--float`` onnxruntime with graph optimizations off (exact QDQ; a QOperator model, whose
integer kernels onnxruntime does not run exactly everywhere, stays on the reference), without
it the reference interpreter (exact ONNX Q/DQ, bit-exact with onnxruntime) — and the
reference is the float value of the same tensor, so the error accumulates everything upstream
(as in the deployed model), not just this layer's rounding::

    stats = quantization_error(reference, (q_out - zp) * s, scale=s)

reported as SQNR (dB), cosine, L2, relative L2 and max error in LSB of ``s``, worst (lowest
SQNR) first. Where the reference comes from:

- ``--float FP32.onnx``: the user's float model run by onnxruntime with every intermediate
  tensor as an output, tensors matched by name (compiler/float_model.py says how the
  quantizers name them). Quantizers with no float tensor of a matching name and shape are
  listed, not guessed.
- otherwise the float model is rebuilt from the quantized one: every Q -> DQ pair removed (the
  DQ's readers read Q's float input), quantized weights left as ``DequantizeLinear(w_q)`` (so
  their rounding is not counted), and where onnxruntime's quantizer removed a Relu / Clip in
  front of the quantizer (its range starts at real 0 right after a Conv / ConvTranspose /
  MatMul / Gemm / Add / BatchNormalization: passes/strip_quantization.py
  ``implied_activation``, the fp32 mode's rule) the activation is put back: a ReLU, capped at 6
  when the range's top is within one step of 6 (a Relu6 or HardSwish's Clip(0, 6) whose
  calibration reached the cap). The calibrated top is not used as a cap otherwise: values the
  quantizer clips there are quantization error to report, not part of the float model.
  Measured against onnxruntime's fp32-vs-int8 comparison on the real-model zoo's QDQ models,
  this rule agreed best of those tried — strip only, a ReLU wherever a range starts at 0 (the
  earlier rule: PP-OCR cls's HardSwish became x·relu(x+3)/6, SQNR ~0 dB, L2 inf), a cap at
  6 anywhere, the calibrated top as the cap (the fp32 mode's clamp: the PP-OCR detector's most
  clipped ReLU, 1.4 dB in truth, came out exact); what it cannot see is weight rounding (PP-OCR
  cls's squeeze-excitation convs: up to 22 dB too optimistic) and a cap calibration did not
  reach. The output says so.

The two int8 engines round some float ops differently (fused multiply-adds, summation order):
one-step differences at ties, which compound through sensitive models (PP-LCNet quantized by
NNCF: 1 LSB on a few pixels after the first HardSwish, up to 14 LSB on a third of the values 16
layers later), so their SQNRs can differ by more than 0.5 dB on such a layer; where the int8
values are the same, so is the SQNR.

SQNR ``10·log10(Σref² / Σerr²)``: a tensor with no error is "exact" (JSON null, note
``exact``); an all-zero reference with an error has no SQNR (JSON null, note ``zero
reference``); a reference that is not finite (NaN / inf in the float model) is reported with a
note and no statistics rather than printing NaN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from qfuse.ir.graph import Graph, Node
from qfuse.ir.ops import ClipAttrs, Op
from qfuse.passes.strip_quantization import implied_activation
from qfuse.runtime.numerics import dequantize, quantization_error
from qfuse.runtime.numerics.error import cosine
from qfuse.runtime.reference import evaluate

__all__ = ["Reference", "error_report", "float_shadow", "format_text", "json_payload",
           "main_error", "rebuilt_reference", "user_reference"]

REBUILT_NOTE = ("the float model is rebuilt from the quantized one: weights are the dequantized "
                "int8 weights (their rounding is not counted); {n} activation(s) the quantizers "
                "stand for (ranges starting at real 0 after Conv/MatMul/Gemm/Add/"
                "BatchNormalization, where onnxruntime's quantizer removes a Relu or Clip) put "
                "back as ReLU, {capped} of them capped at 6 (range top within a step of 6); a "
                "clip whose cap the range does not show cannot be recovered. --float FP32.onnx "
                "compares with the real float model.")
SIX = 6.0  # the cap of Relu6 and of HardSwish's Clip(0, 6)


@dataclass
class Reference:
    """Float values of the quantized tensors: ``names[q output]`` is the key in ``values``."""

    description: str
    values: dict[str, np.ndarray]
    names: dict[str, str]
    unmatched: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _quant(graph: Graph, q: Node) -> tuple[np.ndarray, np.ndarray, int | None]:
    scale = graph.constant(q.inputs[1])
    zp_name = q.inputs[2] if len(q.inputs) > 2 else ""
    zp = graph.constant(zp_name) if zp_name else np.zeros((), np.int64)
    if scale is None or zp is None:
        raise ValueError(f"node {q}: scale and zero point must be constants")
    axis = q.attrs.axis if scale.size > 1 else None
    return scale, zp, axis


def activation_quantizers(graph: Graph) -> list[Node]:
    """The QuantizeLinear nodes on activations (not on constant weights), in graph order."""
    return [n for n in graph.topo_order()
            if n.op is Op.QUANTIZE_LINEAR and graph.constant(n.inputs[0]) is None]


def float_shadow(graph: Graph) -> tuple[Graph, dict[str, str], tuple[int, int]]:
    """The rebuilt float model (module docstring): (graph, {q output: the shadow's value that
    stands for dequantize(q)}, (activations put back, of them capped at 6))."""
    shadow = graph.copy()
    stands_for: dict[str, str] = {}
    restored = capped = 0
    for q in [n for n in shadow.topo_order() if n.op is Op.QUANTIZE_LINEAR]:
        x = q.inputs[0]
        readers = [r for r, _ in shadow.consumers(q.outputs[0])
                   if r.op is Op.DEQUANTIZE_LINEAR]
        top = implied_activation(shadow, q)
        if top is not None:
            step = float(np.asarray(_quant(shadow, q)[0]).ravel()[0])
            cap = SIX if abs(top - SIX) <= step else math.inf
            clip = shadow.add_node(Op.CLIP, [x], [shadow.unique_name(f"{x}_shadow_clip")],
                                   ClipAttrs(0.0, cap), infos=[shadow.info(x)])
            x = clip.outputs[0]
            restored += 1
            capped += int(cap == SIX)
        stands_for[q.outputs[0]] = x
        for reader in readers:
            shadow.replace_all_uses(reader.outputs[0], x)
            shadow.remove_node(reader)
        if not shadow.uses(q.outputs[0]):
            shadow.remove_node(q)
    return shadow, stands_for, (restored, capped)


def rebuilt_reference(graph: Graph, feeds: dict[str, np.ndarray]) -> Reference:
    shadow, stands_for, (restored, capped) = float_shadow(graph)
    with np.errstate(all="ignore"):  # a reference that overflows is reported per row
        values = evaluate(shadow, feeds, keep=True)
    return Reference("the float model rebuilt from the quantized one", values, stands_for,
                     notes=[REBUILT_NOTE.format(n=restored, capped=capped)])


def user_reference(graph: Graph, feeds: dict[str, np.ndarray], path: Path) -> Reference:
    """The user's float model (compiler/float_model.py), matched to ``graph``'s quantizers."""
    from qfuse.compiler.float_model import FloatModel, candidates

    model = FloatModel(path)
    values = model.run(feeds)
    names: dict[str, str] = {}
    unmatched: list[str] = []
    for q in activation_quantizers(graph):
        shape = graph.info(q.outputs[0]).shape
        found = next((n for n in candidates(q.inputs[0], q.outputs[0])
                      if n in values and tuple(values[n].shape) == tuple(shape)), None)
        if found is None:
            unmatched.append(q.outputs[0])
            continue
        after = model.activation_after.get(found)
        if after in values and _starts_at_zero(graph, q):
            found = after  # a Relu / Clip folded into this quantizer (module docstring)
        names[q.outputs[0]] = found
    notes = []
    if unmatched:
        notes.append(f"{len(unmatched)} quantized tensor(s) have no float tensor of a matching "
                     f"name and shape in {path.name}: {', '.join(unmatched[:5])}"
                     + (" ..." if len(unmatched) > 5 else ""))
    return Reference(f"the float model {path} (onnxruntime, tensors matched by name)", values,
                     names, unmatched, notes)


def _starts_at_zero(graph: Graph, q: Node) -> bool:
    _, zp, _ = _quant(graph, q)
    return bool(np.all(np.asarray(zp, np.int64) == q.attrs.dtype.range[0]))


def _row(graph: Graph, q: Node, actual_q: np.ndarray, ref: np.ndarray, ref_name: str
         ) -> dict[str, Any]:
    scale, zp, axis = _quant(graph, q)
    actual = dequantize(actual_q, scale, zp.astype(np.int64), axis=axis)
    producer = graph.producer(q.inputs[0])
    row: dict[str, Any] = {
        "tensor": q.outputs[0],
        "float_tensor": ref_name,
        "layer": producer.name if producer is not None else q.inputs[0],
        "op": producer.op.value if producer is not None else "input",
        "elements": int(actual.size),
        "l2": None, "relative_l2": None, "sqnr_db": None, "cosine": None, "max_error_lsb": None,
        "note": "",
    }
    if not np.all(np.isfinite(ref)):
        row["note"] = "reference not finite"
        return row
    lsb = scale if axis is None else scale.reshape(
        [-1 if i == axis % actual.ndim else 1 for i in range(actual.ndim)])
    stats = quantization_error(ref, actual, scale=lsb)
    row.update(l2=stats.l2_error, max_error_lsb=stats.max_error_lsb,
               cosine=cosine(ref, actual))
    if stats.sum_err_sq == 0:
        row["note"] = "exact"
    elif stats.sum_sq == 0:
        row["note"] = "zero reference"
    else:
        row.update(sqnr_db=stats.sqnr_db, relative_l2=stats.relative_l2)
    return row


def _order(row: dict[str, Any]) -> tuple[float, str]:
    """Worst first: zero references with an error, then by SQNR, exact and non-finite last."""
    note, sqnr = row["note"], row["sqnr_db"]
    key = {"zero reference": -math.inf, "exact": math.inf,
           "reference not finite": math.inf}.get(note, sqnr)
    return key, row["tensor"]


def runs_exact_in_onnxruntime(path: Path) -> bool:
    """True when onnxruntime with optimizations off runs the model's quantization exactly:
    QDQ only (DequantizeLinear -> float op -> QuantizeLinear). Its integer kernels (QLinearConv,
    ConvInteger, QGemm, ...) are not: on CPUs without VNNI, MLAS sums u8·s8 pairs in int16 with
    saturation (PP-OCR cls QOperator: 16 steps off at the first convolution on AVX2)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return not any(n.op_type.startswith("QLinear") or n.op_type.endswith("Integer")
                   or n.op_type in ("QGemm", "QAttention") for n in model.graph.node)


def onnxruntime_int8(path: Path, names: list[str], feeds: dict[str, np.ndarray]
                     ) -> dict[str, np.ndarray]:
    """The tensors ``names`` (those the ONNX file holds) of the quantized model at ``path``,
    run by onnxruntime with graph optimizations off (exact QDQ)."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(path))
    tensors = {o for n in model.graph.node for o in n.output}
    have = {o.name for o in model.graph.output}
    model.graph.output.extend(onnx.ValueInfoProto(name=n) for n in dict.fromkeys(names)
                              if n in tensors and n not in have)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    inputs = {i.name for i in session.get_inputs()}
    values = session.run(None, {k: v for k, v in feeds.items() if k in inputs})
    return {o.name: v for o, v in zip(session.get_outputs(), values, strict=True)}


def error_report(graph: Graph, feeds: dict[str, np.ndarray], float_model: Path | None = None,
                 int8_model: Path | None = None) -> tuple[list[dict[str, Any]], Reference]:
    """One row per quantized activation tensor, worst (lowest SQNR) first, and the reference.
    ``int8_model``: the quantized ONNX file, to run it with onnxruntime instead of the
    reference interpreter (tensors it does not hold are left out)."""
    if int8_model is None:
        with np.errstate(all="ignore"):
            quantized = evaluate(graph, feeds, keep=True)
    else:
        quantized = onnxruntime_int8(Path(int8_model), [q.outputs[0] for q in
                                                        activation_quantizers(graph)], feeds)
    reference = (rebuilt_reference(graph, feeds) if float_model is None
                 else user_reference(graph, feeds, Path(float_model)))
    rows = []
    for q in activation_quantizers(graph):
        ref_name = reference.names.get(q.outputs[0])
        if ref_name is None or q.outputs[0] not in quantized:
            continue
        ref = np.asarray(reference.values[ref_name], np.float64)
        rows.append(_row(graph, q, quantized[q.outputs[0]], ref, ref_name))
    rows.sort(key=_order)
    return rows, reference


def json_payload(rows: list[dict[str, Any]], reference: Reference, inputs: str
                 ) -> dict[str, Any]:
    return {"inputs": inputs, "reference": reference.description,
            "sort": "sqnr_db ascending (worst first)", "layers": rows,
            "unmatched": reference.unmatched, "notes": reference.notes}


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_text(rows: list[dict[str, Any]], reference: Reference, inputs: str) -> str:
    lw = max([len("layer")] + [len(f"{r['layer']} ({r['op']})") for r in rows])
    tw = max([len("tensor")] + [len(r["tensor"]) for r in rows])
    header = (f"{'layer':<{lw}}  {'tensor':<{tw}}  {'SQNR dB':>8}  {'cosine':>8}  "
              f"{'rel L2':>9}  {'L2':>9}  {'max LSB':>8}")
    lines = [f"quantization error against {reference.description}; inputs: {inputs}", header]
    for r in rows:
        sqnr = _num(r["sqnr_db"], ".2f") if not r["note"] else r["note"]
        lines.append(f"{r['layer'] + ' (' + r['op'] + ')':<{lw}}  {r['tensor']:<{tw}}  "
                     f"{sqnr:>8}  {_num(r['cosine'], '.5f'):>8}  "
                     f"{_num(r['relative_l2'], '.3g'):>9}  {_num(r['l2'], '.3g'):>9}  "
                     f"{_num(r['max_error_lsb'], '.2f'):>8}")
    lines += [f"note: {note}" for note in reference.notes]
    return "\n".join(lines)


def main_error(args: Any) -> int:
    """``qfuse inspect MODEL --error [--float FP32.onnx] [--json] [--inputs IN.npz|IN.npy]``."""
    from qfuse.compiler.api import compile_model, random_inputs
    from qfuse.compiler.cli import input_shapes
    from qfuse.compiler.cli_output import emit
    from qfuse.compiler.input_files import read_inputs

    model = compile_model(args.model, mode="reference", input_shapes=input_shapes(args))
    if args.inputs:
        feeds = read_inputs(Path(args.inputs), model.inputs)
        inputs = str(args.inputs)
    else:
        feeds, inputs = random_inputs(model, seed=0), "random N(0,1), seed 0"
    float_model = getattr(args, "float_model", None)
    # the int8 side runs on the engine of the float side unless told (module docstring)
    engine = getattr(args, "int8_engine", None) or (
        "onnxruntime" if float_model and runs_exact_in_onnxruntime(args.model) else "reference")
    rows, reference = error_report(model.graph, feeds, float_model,
                                   args.model if engine == "onnxruntime" else None)
    reference.description += f"; int8 values by {engine}"

    emit(args.json, json_payload(rows, reference, inputs),
         lambda: format_text(rows, reference, inputs))
    return 0
