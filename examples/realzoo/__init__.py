"""The real-model zoo: trained ONNX models from pinned PyPI wheels, quantized three ways.

Five models that ship inside PyPI packages (``sources.py``), each made static-shape, fed
realistic pictures preprocessed as its package does (``inputs.py``), and quantized by
onnxruntime quantize_static in QDQ and in QOperator format and by nncf.quantize
(``quantize.py``). The models themselves are described in ``specs.py``; the measurement of
qfuse on them is ``table.py``.

    from qfuse.examples import realzoo
    for entry in realzoo.models():                 # downloads / builds on first use, then cached
        entry.float_path, entry.quantized["qdq"]   # Paths of ONNX files
        entry.calibration, entry.evaluation        # lists of {input name: float32 array}
        entry.errors.get("nncf"), entry.notes["qdq"]

    python -m qfuse.examples.realzoo build         # or `make realzoo`
    python -m qfuse.examples.realzoo table [--json]

Cache: ``$QFUSE_CACHE/realzoo`` or ``~/.cache/qfuse/realzoo``. Every file is named by a hash of
what it is made from (wheel SHA-256, static shape, the code of the source file of this package
that makes it, the names (hashes) of the files it is made from, and the versions of onnx,
onnxruntime, sympy, nncf, scikit-image and Pillow), written to a temporary name and renamed
into place; a second call only checks that the files exist (and loads the inputs). ONNX
Runtime's outputs on the evaluation inputs are cached too (``table.ort_outputs``). A quantizer
that fails is cached as its error message (``*.json`` beside where the model would be), so it
is reported, not retried, until something in its key changes.

Calibration uses CALIB_SAMPLES inputs; evaluation EVAL_SAMPLES others from disjoint sources.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import numpy as np
import onnx

from .quantize import QUANTIZERS
from .sources import WHEELS, extract_member, fetch_wheel, fix_shapes, static_shapes
from .specs import SPECS, Spec

log = logging.getLogger(__name__)

CALIB_SAMPLES = 16
EVAL_SAMPLES = 8
# Bump to rebuild everything (each layer's own source file is part of its key anyway).
REALZOO_VERSION = "1"

__all__ = ["CALIB_SAMPLES", "EVAL_SAMPLES", "QUANTIZERS", "SPECS", "Entry", "Spec",
           "cache_dir", "models"]


@dataclass
class Entry:
    """One zoo model, built: files, inputs, and per quantizer a path or an error."""

    spec: Spec
    float_path: Path
    input_name: str
    calibration: list[dict[str, np.ndarray]]
    evaluation: list[dict[str, np.ndarray]]
    quantized: dict[str, Path] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    notes: dict[str, list[str]] = field(default_factory=dict)
    inputs_path: Path | None = None  # the .npz the inputs come from (its name is their hash)
    cache: Path | None = None  # the cache root the files are in

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def task(self) -> str:
        return self.spec.task


def cache_dir() -> Path:
    env = os.environ.get("QFUSE_CACHE")
    return (Path(env) if env else Path.home() / ".cache" / "qfuse") / "realzoo"


@functools.cache
def _digest(*files: str) -> str:
    """Hash of the code in this package's source files ``files`` (each layer of the cache is
    keyed on its own): the syntax tree without docstrings, so comments and docs do not
    invalidate the cache, code does."""
    h = hashlib.sha256()
    for name in files:
        tree = ast.parse((Path(__file__).parent / name).read_text())
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                    and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                node.body = body[1:] or [ast.Pass()]
        h.update(name.encode() + b"\0" + ast.dump(tree).encode())
    return h.hexdigest()[:16]


def dist_version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "absent"


def _key(*files: str, **ident: object) -> str:
    ident["realzoo"] = REALZOO_VERSION
    ident["source"] = _digest(*files)
    blob = json.dumps(ident, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _float_model(spec: Spec, cache: Path) -> Path:
    wheel = WHEELS[spec.wheel]
    key = _key("sources.py", wheel=wheel.sha256, member=spec.member, shape=spec.shape,
               onnx=onnx.__version__, ort=dist_version("onnxruntime"))
    path = cache / "float" / f"{spec.name}-{key}.onnx"
    if not path.exists():
        log.info("realzoo: extracting %s from %s", spec.member, wheel.filename)
        model = onnx.load_from_string(extract_member(fetch_wheel(wheel, cache), spec.member))
        name = _input_name(model)
        fixed = static_shapes(fix_shapes(model, {name: spec.shape}), name, spec.shape)
        onnx.checker.check_model(fixed, full_check=True)
        write_atomic(path, fixed.SerializeToString(deterministic=True))
    return path


def _input_name(model: onnx.ModelProto) -> str:
    inits = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits]
    if len(names) != 1:
        raise ValueError(f"expected one graph input, found {names}")
    return names[0]


def _inputs(spec: Spec, cache: Path) -> tuple[Path, np.ndarray, np.ndarray]:
    key = _key("inputs.py", "specs.py", name=spec.name, shape=spec.shape, calib=CALIB_SAMPLES,
               eval=EVAL_SAMPLES, skimage=dist_version("scikit-image"),
               pillow=dist_version("pillow"), numpy=np.__version__)
    path = cache / "inputs" / f"{spec.name}-{key}.npz"
    if not path.exists():
        log.info("realzoo: rendering inputs of %s", spec.name)
        calib = np.concatenate(spec.make_inputs("calib", CALIB_SAMPLES))
        evals = np.concatenate(spec.make_inputs("eval", EVAL_SAMPLES))
        for split, arr, n in (("calib", calib, CALIB_SAMPLES), ("eval", evals, EVAL_SAMPLES)):
            want = (n * spec.shape[0], *spec.shape[1:])
            if arr.shape != want or arr.dtype != np.float32:
                raise AssertionError(f"{spec.name} {split} inputs {arr.shape} {arr.dtype}, "
                                     f"want {want} float32")
        import io

        buf = io.BytesIO()
        np.savez(buf, calib=calib, eval=evals)
        write_atomic(path, buf.getvalue())
    with np.load(path) as z:
        return path, z["calib"], z["eval"]


def _quantized(spec: Spec, quantizer: str, float_path: Path, inputs_path: Path,
               calibration: list[dict[str, np.ndarray]], cache: Path,
               ) -> tuple[Path | None, str | None, list[str]]:
    """(path, None, notes) of the quantized model, or (None, error, notes) if it failed."""
    key = _key("quantize.py", float=float_path.name, inputs=inputs_path.name, quantizer=quantizer,
               ort=dist_version("onnxruntime"), sympy=dist_version("sympy"),
               nncf=dist_version("nncf") if quantizer == "nncf" else "")
    path = cache / "quantized" / f"{spec.name}.{quantizer}-{key}.onnx"
    meta = path.with_suffix(".json")
    if not meta.exists():
        from .quantize import quantize

        log.info("realzoo: quantizing %s with %s", spec.name, quantizer)
        try:
            model, notes = quantize(onnx.load(float_path), calibration, quantizer)
            write_atomic(path, model.SerializeToString(deterministic=True))
            record = {"error": None, "notes": notes}
        except Exception as exc:  # noqa: BLE001 - a quantizer failure is a measured result
            record = {"error": f"{type(exc).__name__}: {exc}", "notes": []}
        write_atomic(meta, json.dumps(record, indent=1).encode())
    record = json.loads(meta.read_text())
    if record["error"] is None and not path.exists():  # the model was deleted by hand
        meta.unlink()
        return _quantized(spec, quantizer, float_path, inputs_path, calibration, cache)
    return (None if record["error"] else path), record["error"], record["notes"]


def build(spec: Spec, quantizers: Sequence[str] = QUANTIZERS,
          cache: Path | None = None) -> Entry:
    """The Entry of ``spec``, building whatever the cache does not hold yet."""
    cache = cache or cache_dir()
    float_path = _float_model(spec, cache)
    name = _input_name(onnx.load(float_path, load_external_data=False))
    inputs_path, calib, evals = _inputs(spec, cache)
    b = spec.shape[0]
    entry = Entry(spec, float_path, name,
                  [{name: calib[i:i + b]} for i in range(0, len(calib), b)],
                  [{name: evals[i:i + b]} for i in range(0, len(evals), b)],
                  inputs_path=inputs_path, cache=cache)
    for q in quantizers:
        path, error, notes = _quantized(spec, q, float_path, inputs_path, entry.calibration,
                                        cache)
        entry.notes[q] = notes
        if path is not None:
            entry.quantized[q] = path
        else:
            entry.errors[q] = error or "unknown error"
    return entry


def models(names: Sequence[str] | None = None, quantizers: Sequence[str] = QUANTIZERS,
           cache: Path | None = None) -> list[Entry]:
    """Every zoo model (or those in ``names``), built and quantized by ``quantizers``."""
    unknown = set(names or ()) - set(SPECS)
    if unknown:
        raise ValueError(f"unknown realzoo models {sorted(unknown)}; known: {', '.join(SPECS)}")
    unknown_q = set(quantizers) - set(QUANTIZERS)
    if unknown_q:
        raise ValueError(f"unknown quantizers {sorted(unknown_q)}; known: {', '.join(QUANTIZERS)}")
    return [build(SPECS[n], quantizers, cache) for n in (names or SPECS)]
