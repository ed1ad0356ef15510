"""``qfuse inspect --error --float FP32.onnx`` against an independent onnxruntime comparison.

On the real-model zoo (trained models, real pictures; examples/realzoo), for every quantized
activation tensor: the SQNR qfuse reports must be within 0.5 dB of the one computed here with
onnxruntime alone — the float model run with every tensor as an output, the quantized model
run exactly (graph optimizations off) with every quantizer's DequantizeLinear output as an
output, the float tensor being the one the quantizer reads (quantize_static's
``X_QuantizeLinear_Input`` for a graph output ``X``). No numpy warning may be raised and no
NaN / inf printed.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from qfuse.compiler.api import import_graph
from qfuse.compiler.error_report import error_report, format_text
from qfuse.examples import realzoo
from qfuse.runtime.reference import evaluate

FAST = ["ppocr_cls", "pplcnet_orientation"]
SLOW = ["yolov8n_nudenet", "ppocrv4_rec", "ppocrv4_det"]
TOLERANCE_DB = 0.5


def _session(model: onnx.ModelProto, outputs: list[str]) -> ort.InferenceSession:
    model = onnx.ModelProto.FromString(model.SerializeToString())
    have = {o.name for o in model.graph.output}
    model.graph.output.extend(onnx.ValueInfoProto(name=n) for n in outputs if n not in have)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def ort_sqnr(float_path: str, quantized_path: str, feeds: dict[str, np.ndarray]
             ) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """{QuantizeLinear output: SQNR dB of its DequantizeLinear against the float tensor}, and
    {QuantizeLinear output: its integer value}."""
    qm, fm = onnx.load(quantized_path), onnx.load(float_path)
    consts = {i.name for i in qm.graph.initializer} | {
        o for n in qm.graph.node if n.op_type == "Constant" for o in n.output}
    float_names = {o for n in fm.graph.node for o in n.output} | {i.name for i in fm.graph.input}
    dq_of = {n.input[0]: n.output[0] for n in qm.graph.node if n.op_type == "DequantizeLinear"}
    pairs = {}
    for n in qm.graph.node:
        if n.op_type != "QuantizeLinear" or n.input[0] in consts or n.output[0] not in dq_of:
            continue
        src = n.input[0].removesuffix("_QuantizeLinear_Input")
        if src in float_names:
            pairs[n.output[0]] = (src, dq_of[n.output[0]])
    fs = _session(fm, sorted({s for s, _ in pairs.values()}))
    qs = _session(qm, sorted({d for _, d in pairs.values()} | set(pairs)))
    fo = dict(zip([o.name for o in fs.get_outputs()], fs.run(None, feeds), strict=True))
    fo.update(feeds)
    qo = dict(zip([o.name for o in qs.get_outputs()], qs.run(None, feeds), strict=True))
    out = {}
    for q, (src, dq) in pairs.items():
        ref, act = fo[src].astype(np.float64), qo[dq].astype(np.float64)
        err = float(np.sum((act - ref) ** 2))
        if err > 0 and np.any(ref):
            out[q] = 10 * math.log10(float(np.sum(ref * ref)) / err)
    return out, {q: qo[q] for q in pairs}


def _check(name: str, quantizer: str, engine: str) -> None:
    (entry,) = realzoo.models([name], [quantizer])
    path = entry.quantized[quantizer]
    feeds = entry.evaluation[0]
    want, ort_int8 = ort_sqnr(str(entry.float_path), str(path), feeds)
    graph = import_graph(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a numpy RuntimeWarning fails the test
        rows, reference = error_report(graph, feeds, entry.float_path,
                                       path if engine == "onnxruntime" else None)
    text = format_text(rows, reference, "eval[0]")
    tokens = {t.lower() for t in text.split()}
    assert not tokens & {"nan", "inf", "-inf", "+inf"}
    got = {r["tensor"]: r["sqnr_db"] for r in rows if r["sqnr_db"] is not None}
    common = sorted(set(got) & set(want))
    assert len(common) >= 0.95 * len(want) > 0, (len(common), len(want))
    diffs = {t: abs(got[t] - want[t]) for t in common}
    worst = max(diffs, key=diffs.__getitem__)
    print(f"{name} {quantizer} {engine}: {len(common)} tensors, max |dB diff| "
          f"{diffs[worst]:.4f} ({worst}), median {np.median(list(diffs.values())):.4f}")
    if engine == "reference":
        # where qfuse's int8 values are onnxruntime's, the SQNR must be too (same float
        # tensor); elsewhere the engines' rounding differs (error_report's docstring)
        int8 = evaluate(graph, feeds, keep=True)
        same = {t for t in common if np.array_equal(int8[t], ort_int8[t])}
        assert max(diffs[t] for t in same) < 1e-6
        assert all(diffs[t] <= TOLERANCE_DB for t in common if t in same)
    else:
        assert diffs[worst] <= TOLERANCE_DB, (worst, got[worst], want[worst])


@pytest.mark.parametrize("engine", ["reference", "onnxruntime"])
@pytest.mark.parametrize("quantizer", ["qdq", "nncf"])
@pytest.mark.parametrize("name", FAST)
def test_inspect_error_float_agrees_with_onnxruntime(name: str, quantizer: str,
                                                     engine: str) -> None:
    _check(name, quantizer, engine)


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["reference", "onnxruntime"])
@pytest.mark.parametrize("quantizer", ["qdq", "nncf"])
@pytest.mark.parametrize("name", SLOW)
def test_inspect_error_float_agrees_with_onnxruntime_large(name: str, quantizer: str,
                                                           engine: str) -> None:
    _check(name, quantizer, engine)
