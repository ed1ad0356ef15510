"""How qfuse does on the real-model zoo: per model x quantizer, does it compile, and how faithful.

For every zoo entry and quantizer (``measure``):
- reference = "exact QDQ": ONNX Runtime running the quantized model with
  ``GraphOptimizationLevel.ORT_DISABLE_ALL``, so every QuantizeLinear / DequantizeLinear runs
  as written, with no int8 fusion; for a QOperator model, its QLinearConv / QLinearMatMul /
  QGemm first written in that QDQ form (``exact.py``: ORT runs them with int8 kernels at every
  optimization level, and those saturate on CPUs without VNNI);
- ORT = ONNX Runtime's default session (all optimizations: its own int8 kernels) on the same
  model, the yardstick for how close an int8 engine gets;
- qfuse = ``qfuse.compile_model(path, mode="fused")``; a compile or run failure is recorded with
  its message, not raised.
On the held-out evaluation inputs it reports
- cosine: ``a.b / (|a| |b|)`` of the first output against the reference, minimum over inputs;
- agreement: mean over inputs of the task's own decision compared with the reference's:
  'classify' top-1 equal; 'ctc' fraction of time steps whose argmax is equal (what CTC greedy
  decoding reads); 'text_mask' IoU of the DB probability maps thresholded at 0.3 (rapidocr's
  ``thresh``); 'yolo' F1 of detections decoded as nudenet does (class score >= 0.2, NMS at IoU
  0.45, class-agnostic as ``cv2.dnn.NMSBoxes``) matched by class and IoU >= 0.5 (1.0 when both
  find nothing);
- noise: how far the reference moves from itself when NOISE_SHARE of its input values (at
  least one) move by one quantization step of the input (``(max - min)/255`` of that input,
  random positions; the lowest of NOISE_DRAWS draws): the model's own sensitivity to a few one-step differences, the
  size of the differences any int8 engine makes at rounding ties. A cosine below it measures
  that sensitivity, not a wrong kernel (PP-OCRv4 det on the photographed page: the DB map is
  ~1e-6 everywhere and 46 of its 921,600 input values moved by one step take exact QDQ to
  0.96 (QDQ) or 0.81 (NNCF));
- kernels: how many kernels the plan has, how many read int8, how many run in numpy, and the
  float islands if the compiled model's ``inspect()`` lists them (key 'islands'; '-' when the
  compiler exposes none).

``table(..., isolate=True)`` measures each pair in a child process (``python -m
qfuse.examples.realzoo measure MODEL QUANTIZER``), so a crash of one compile is a row
('crashed: signal 11'), not the end of the table.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from qfuse.runtime.numerics import cosine

from . import QUANTIZERS, Entry, _digest, dist_version, models, write_atomic
from .exact import EXACT_VERSION, exact_qdq


@dataclass
class Row:
    """One model x quantizer measurement (JSON-able with ``asdict``)."""

    model: str
    quantizer: str
    status: str  # ok | quantize failed | compile failed | run failed | crashed
    error: str | None = None
    compile_s: float | None = None
    kernels: int | None = None
    int8_kernels: int | None = None
    numpy_kernels: int | None = None
    islands: int | None = None
    cos_qfuse: float | None = None
    cos_ort: float | None = None
    agree_qfuse: float | None = None
    agree_ort: float | None = None
    agree_float: float | None = None  # the float model against the reference: quantization loss
    cos_noise: float | None = None  # the reference against itself on inputs moved by one step
    notes: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- measures
def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of box a (4,) against boxes b (n, 4), all as x1, y1, x2, y2."""
    w = np.clip(np.minimum(a[2], b[:, 2]) - np.maximum(a[0], b[:, 0]), 0, None)
    h = np.clip(np.minimum(a[3], b[:, 3]) - np.maximum(a[1], b[:, 1]), 0, None)
    inter = w * h
    area_a = (a[2] - a[0]) * (a[3] - a[1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    return inter / np.maximum(area_a + area_b - inter, 1e-9)


def yolo_detections(out: np.ndarray, score: float = 0.2, nms: float = 0.45
                    ) -> list[tuple[int, np.ndarray]]:
    """nudenet's _postprocess on one image: (class, box x1 y1 x2 y2) after NMS."""
    rows = out[0].T  # (anchors, 4 + classes)
    scores = rows[:, 4:].max(axis=1)
    keep = scores >= score
    rows, scores = rows[keep], scores[keep]
    classes = rows[:, 4:].argmax(axis=1)
    xy, wh = rows[:, :2], rows[:, 2:4]
    boxes = np.concatenate([xy - wh / 2, xy + wh / 2], axis=1)
    order, chosen = list(np.argsort(-scores, kind="stable")), []
    while order:
        i = order.pop(0)
        chosen.append(i)
        if order:
            ious = _iou(boxes[i], boxes[order])
            order = [j for j, v in zip(order, ious, strict=True) if v <= nms]
    return [(int(classes[i]), boxes[i]) for i in chosen]


def detection_f1(ref: list[tuple[int, np.ndarray]], got: list[tuple[int, np.ndarray]]) -> float:
    if not ref and not got:
        return 1.0
    used, matched = set(), 0
    for cls, box in ref:
        for j, (c2, b2) in enumerate(got):
            if j not in used and c2 == cls and _iou(box, b2[None])[0] >= 0.5:
                used.add(j)
                matched += 1
                break
    return 2 * matched / (len(ref) + len(got))


def agreement(task: str, ref: np.ndarray, got: np.ndarray) -> float:
    """How often ``got`` makes the same decision as ``ref`` (1.0 = always), for ``task``."""
    if task == "classify":
        return float(np.mean(ref.argmax(-1) == got.argmax(-1)))
    if task == "ctc":
        return float(np.mean(ref.argmax(-1) == got.argmax(-1)))
    if task == "text_mask":
        a, b = ref > 0.3, got > 0.3
        union = np.logical_or(a, b).sum()
        return 1.0 if union == 0 else float(np.logical_and(a, b).sum() / union)
    if task == "yolo":
        return float(np.mean([detection_f1(yolo_detections(r[None]), yolo_detections(g[None]))
                              for r, g in zip(ref, got, strict=True)]))
    raise ValueError(f"unknown task {task!r}")


# --------------------------------------------------------------------------- running
def _session(path: str, optimize: bool) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    if not optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def _ort_outputs(path: str, feeds: Sequence[dict[str, np.ndarray]], optimize: bool
                 ) -> list[np.ndarray]:
    sess = _session(path, optimize)
    return [sess.run(None, f)[0] for f in feeds]


@functools.cache
def _cpu_id() -> str:
    """What ONNX Runtime's kernel choice depends on: the CPU's model and ISA flags."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    lines = [ln for ln in info.splitlines() if ln.startswith(("model name", "flags"))][:2]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


NOISE_SHARE = 1 / 20000  # of the input values, for Row.cos_noise
NOISE_DRAWS = 3  # random draws of the moved positions; Row.cos_noise is the lowest


def nudged(entry: Entry, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """``entry.evaluation`` with NOISE_SHARE of each input's values (at least one) moved up by
    one quantization step, ``(max - min)/255`` of that input (module docstring: noise)."""
    rng = np.random.default_rng(seed)
    out = []
    for feeds in entry.evaluation:
        x = feeds[entry.input_name].copy()
        step = np.float32((x.max() - x.min()) / 255)
        where = rng.choice(x.size, max(1, round(x.size * NOISE_SHARE)), replace=False)
        x.flat[where] += step
        out.append({**feeds, entry.input_name: x})
    return out


def ort_outputs(entry: Entry, path: Path, optimize: bool, nudge: int | None = None
                ) -> list[np.ndarray]:
    """ONNX Runtime's outputs for ``entry.evaluation`` (``nudged`` with ``nudge``) on the
    model at ``path``, cached beside the zoo (keyed by the model's and inputs' content-hash
    names, onnxruntime's version and the CPU): they do not depend on qfuse, so a second table
    only compiles and runs qfuse."""
    feeds = entry.evaluation if nudge is None else nudged(entry, nudge)
    if entry.cache is None or entry.inputs_path is None:
        return _ort_outputs(str(path), feeds, optimize)
    ident = json.dumps([path.name, entry.inputs_path.name, optimize, dist_version("onnxruntime"),
                        _cpu_id()] + ([] if nudge is None else [NOISE_SHARE, nudge])).encode()
    out = entry.cache / "outputs" / f"{path.stem}-{hashlib.sha256(ident).hexdigest()[:16]}.npz"
    if out.exists():
        with np.load(out) as z:
            return [z[str(i)] for i in range(len(z.files))]
    arrays = _ort_outputs(str(path), feeds, optimize)
    buf = io.BytesIO()
    np.savez(buf, **{str(i): a for i, a in enumerate(arrays)})
    write_atomic(out, buf.getvalue())
    return arrays


def reference_model(entry: Entry, quantizer: str) -> Path:
    """The model whose ORT_DISABLE_ALL outputs are the reference: the quantized model itself,
    or for QOperator its exact QDQ form (``exact.py``), cached beside the zoo."""
    path = entry.quantized[quantizer]
    if quantizer != "qoperator":
        return path
    root = entry.cache or path.parent.parent
    out = root / "exact" / f"{path.stem}.exact{EXACT_VERSION}-{_digest('exact.py')}.onnx"
    if not out.exists():
        import onnx

        write_atomic(out, exact_qdq(onnx.load(path)).SerializeToString(deterministic=True))
    return out


def _first_error_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text.strip()


def _scores(task: str, ref: list[np.ndarray], got: list[np.ndarray]) -> tuple[float, float]:
    cos = min(cosine(r, g) for r, g in zip(ref, got, strict=True))
    agree = float(np.mean([agreement(task, r, g) for r, g in zip(ref, got, strict=True)]))
    return cos, agree


def _count_islands(info: dict[str, Any]) -> int | None:
    islands = info.get("islands", info.get("float_islands"))
    if islands is None:
        return None
    return len(islands) if hasattr(islands, "__len__") else int(islands)


def measure(entry: Entry, quantizer: str, threads: int | None = None) -> Row:
    """Compile ``entry``'s ``quantizer`` model with qfuse fused and compare (see module doc)."""
    row = Row(entry.name, quantizer, "ok", notes=list(entry.notes.get(quantizer, [])))
    if quantizer not in entry.quantized:
        row.status, row.error = "quantize failed", entry.errors.get(quantizer, "not built")
        return row
    path = entry.quantized[quantizer]
    feeds = entry.evaluation
    ref = ort_outputs(entry, reference_model(entry, quantizer), optimize=False)
    row.cos_noise = min(_scores(entry.task, ref, ort_outputs(
        entry, reference_model(entry, quantizer), optimize=False, nudge=seed))[0]
        for seed in range(NOISE_DRAWS))
    row.cos_ort, row.agree_ort = _scores(entry.task, ref, ort_outputs(entry, path, True))
    row.agree_float = _scores(entry.task, ref, ort_outputs(entry, entry.float_path, True))[1]
    from qfuse import compile_model

    start = time.perf_counter()
    try:
        compiled = compile_model(str(path), mode="fused", threads=threads)
    except Exception as exc:  # noqa: BLE001 - a failure is the measurement
        row.status, row.error = "compile failed", _first_error_line(exc)
        return row
    row.compile_s = round(time.perf_counter() - start, 3)
    info = compiled.inspect()
    kernels = info.get("kernels", [])
    row.kernels = len(kernels)
    row.int8_kernels = sum(str(k.get("src_dtype")) in ("u8", "s8") for k in kernels)
    row.numpy_kernels = info.get("numpy_kernels")
    row.islands = _count_islands(info)
    out_name = compiled.outputs[0]
    try:
        got = [compiled.run(f)[out_name] for f in feeds]
    except Exception as exc:  # noqa: BLE001
        row.status, row.error = "run failed", _first_error_line(exc)
        return row
    row.cos_qfuse, row.agree_qfuse = _scores(entry.task, ref, got)
    return row


def _measure_child(model: str, quantizer: str, threads: int | None) -> Row:
    cmd = [sys.executable, "-m", "qfuse.examples.realzoo", "measure", model, quantizer]
    if threads:
        cmd += ["--threads", str(threads)]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if done.returncode == 0:
        return Row(**json.loads(done.stdout.strip().splitlines()[-1]))
    how = f"signal {-done.returncode}" if done.returncode < 0 else f"exit {done.returncode}"
    tail = done.stderr.strip().splitlines()[-1:] or [""]
    return Row(model, quantizer, "crashed", f"{how}: {tail[0][:300]}")


def table(names: Sequence[str] | None = None, quantizers: Sequence[str] = QUANTIZERS,
          threads: int | None = None, isolate: bool = False) -> list[Row]:
    """Rows for every model x quantizer (building the zoo first if needed)."""
    entries = models(names, quantizers)
    rows = []
    for entry in entries:
        for q in quantizers:
            if isolate and q in entry.quantized:
                rows.append(_measure_child(entry.name, q, threads))
                continue
            try:
                rows.append(measure(entry, q, threads))
            except Exception as exc:  # noqa: BLE001 - e.g. onnxruntime cannot run the model
                rows.append(Row(entry.name, q, "run failed", _first_error_line(exc)))
                traceback.print_exc(file=sys.stderr)
    return rows


def _fmt(v: float | None, spec: str = "") -> str:
    return "-" if v is None else format(v, spec)


def format_table(rows: Sequence[Row], width: int = 100) -> str:
    """Fixed-width text table; errors are listed below it."""
    head = (f"{'model':<20} {'quantizer':<9} {'status':<15} {'kernels':>7} {'int8':>5} "
            f"{'numpy':>5} {'islands':>7} {'cos qfuse':>9} {'cos ORT':>8} {'agree qf':>8} "
            f"{'agree ORT':>9} {'noise':>7}")
    lines = [head]
    for r in rows:
        lines.append(
            f"{r.model:<20} {r.quantizer:<9} {r.status:<15} {_fmt(r.kernels):>7} "
            f"{_fmt(r.int8_kernels):>5} {_fmt(r.numpy_kernels):>5} {_fmt(r.islands):>7} "
            f"{_fmt(r.cos_qfuse, '.5f'):>9} {_fmt(r.cos_ort, '.5f'):>8} "
            f"{_fmt(r.agree_qfuse, '.3f'):>8} {_fmt(r.agree_ort, '.3f'):>9} "
            f"{_fmt(r.cos_noise, '.5f'):>7}")
    ok = sum(r.status == "ok" for r in rows)
    lines.append(f"\n{ok} of {len(rows)} model x quantizer pairs compile and run in qfuse fused")
    errors = [r for r in rows if r.error]
    if errors:
        lines.append("\nfailures:")
        for r in errors:
            msg = r.error.splitlines()[0] if r.error else ""
            if len(msg) > width:
                msg = msg[:width - 3] + "..."
            lines.append(f"  {r.model} / {r.quantizer}: {msg}")
    notes = {(r.model, r.quantizer): r.notes for r in rows if r.notes}
    if notes:
        lines.append("\nquantizer notes:")
        for (m, q), ns in notes.items():
            lines += [f"  {m} / {q}: {n[:width]}" for n in ns]
    return "\n".join(lines)


def rows_json(rows: Sequence[Row]) -> str:
    return json.dumps([asdict(r) for r in rows], indent=1)
