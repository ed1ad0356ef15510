"""The engines `qfuse bench` compares: qfuse's own modes, ONNX Runtime and OpenVINO.

Every engine is built from the same ONNX file with the same thread count and gets the same
feeds; ``Engine.run()`` runs one inference on them (the timed call) and ``Engine.outputs()``
returns the outputs as a list in the model's output order (for the agreement check).

- qfuse ``fused`` / ``unfused`` / ``fp32`` / ``reference``: ``compile_model(path, mode,
  threads=N)``; the timed call is ``CompiledModel.run`` (validates and copies the inputs in,
  copies the outputs out).
- qfuse ``fused-inexact``: fused with ``exact_int8=False`` — on a CPU without VNNI / AMX,
  oneDNN's int8 kernels as they are (int16-saturating pair sums, as ONNX Runtime's and
  OpenVINO's there) instead of the exact split weights; the same as ``fused`` elsewhere.
- ONNX Runtime: CPU provider, ``intra_op_num_threads=N``, ``inter_op_num_threads=1``, sequential
  execution, default graph optimizations (ORT_ENABLE_ALL, which runs its QDQ fusions). Its
  pool threads spin while it runs, as by default, but stop when ``run`` returns
  (``session.force_spinning_stop``): left spinning, they kept taking a core from the engine
  timed after ONNX Runtime's block (GhostNetV2 QDQ at two threads: qfuse 7.1 ms right after
  ONNX Runtime's runs, 2.9 ms with the spinning stopped, 2.6 ms alone; ONNX Runtime's own
  time 4.7 and 4.5 ms; LeViT-128S: 3.6 and 3.9 ms).
- OpenVINO: ``Core().read_model`` of the QDQ ONNX file (its LPT turns Q/DQ into int8), compiled
  on "CPU" with ``INFERENCE_NUM_THREADS=N`` and ``PERFORMANCE_HINT=LATENCY``, one infer request.
  The runtime model (the executed graph) is read back to count the layers that ran in I8/U8,
  so a silent fall-back to f32/bf16 shows up in the table. OpenVINO first compiles and runs
  the model once in a child process (``_openvino_survives``): OpenVINO 2026.4.1 dies with a
  segmentation fault compiling torchvision's DenseNet-121 quantized by quantize_static, which
  in-process would take the whole bench down; such a model makes the engine unavailable, with
  the signal named.

A missing optional package raises ``EngineUnavailable`` with a message; the bench skips that
engine and says why.
"""

from __future__ import annotations

import importlib
import logging
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from qfuse.compiler.errors import InputError
from qfuse.ir.mode import Mode

log = logging.getLogger(__name__)

QFUSE_MODES = tuple(m.value for m in Mode)
# fused with exact_int8=False: oneDNN's int16-saturating int8 kernels where there is no VNNI
INEXACT = "fused-inexact"
EXTERNAL = ("onnxruntime", "openvino", "openvino-f32")
ENGINES = (*QFUSE_MODES, INEXACT, *EXTERNAL)
# OpenVINO layer types that do the int8 multiply-accumulate work.
_OV_COMPUTE = ("Convolution", "Deconvolution", "FullyConnected", "MatMul", "GroupConvolution")
_OV_SKIP = {"Const", "Input", "Output", "Parameter", "Result"}


class EngineUnavailable(RuntimeError):
    """An optional engine cannot run here (its package is missing or refuses the model)."""


@dataclass
class Engine:
    name: str
    run: Callable[[], object]
    outputs: Callable[[], list[np.ndarray]]
    compile_s: float
    info: dict[str, Any] = field(default_factory=dict)
    compiled: Any = None  # the qfuse CompiledModel, for qfuse modes


def make_engine(name: str, model: Path, threads: int, feeds: dict[str, np.ndarray]) -> Engine:
    """Build engine ``name`` (one of ENGINES) on ``model`` with ``threads`` threads."""
    if name in QFUSE_MODES:
        return _qfuse(name, model, threads, feeds)
    if name == INEXACT:
        return _qfuse("fused", model, threads, feeds, exact_int8=False, label=INEXACT)
    if name == "onnxruntime":
        return _onnxruntime(model, threads, feeds)
    if name == "openvino":
        return _openvino(model, threads, feeds)
    if name == "openvino-f32":
        return _openvino(model, threads, feeds, precision="f32")
    raise InputError(f"unknown engine {name!r}; choose from {', '.join(ENGINES)}")


def _import(package: str) -> Any:
    try:
        return importlib.import_module(package)
    except ImportError as exc:
        raise EngineUnavailable(f"{package} is not installed ({exc}); "
                                f"pip install {package} (or the `bench` extra)") from None


def _qfuse(mode: str, model: Path, threads: int, feeds: dict[str, np.ndarray], *,
           exact_int8: bool = True, label: str | None = None) -> Engine:
    from qfuse.compiler.api import compile_model

    start = time.perf_counter()
    compiled = compile_model(model, mode=mode, threads=threads, exact_int8=exact_int8)
    seconds = time.perf_counter() - start
    names = compiled.outputs

    def run() -> dict[str, np.ndarray]:
        return compiled.run(feeds)

    def outputs() -> list[np.ndarray]:
        result = compiled.run(feeds)
        return [result[n] for n in names]

    info: dict[str, Any] = {}
    if compiled.plan is not None:
        kernels = compiled.plan.kernels
        impls = Counter(k.impl for k in kernels)
        info = {"kernels": len(kernels), "reorders": compiled.plan.reorders,
                "numpy_kernels": impls.get("numpy", 0),
                "onnxruntime_kernels": impls.get("onnxruntime", 0),
                "ref_kernels": sum(c for i, c in impls.items() if i.startswith("ref")),
                "impls": dict(impls.most_common())}
    return Engine(label or mode, run, outputs, seconds, info, compiled)


def _onnxruntime(model: Path, threads: int, feeds: dict[str, np.ndarray]) -> Engine:
    ort = _import("onnxruntime")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.add_session_config_entry("session.force_spinning_stop", "1")  # module docstring
    start = time.perf_counter()
    try:
        session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - ORT's own exception types; report, do not crash
        raise EngineUnavailable(f"onnxruntime refused the model: {exc}") from None
    seconds = time.perf_counter() - start

    def run() -> list[np.ndarray]:
        return session.run(None, feeds)

    info = {"version": ort.__version__, "intra_op_num_threads": threads,
            "inter_op_num_threads": 1, "execution_mode": "sequential",
            "force_spinning_stop": True}
    return Engine("onnxruntime", run, run, seconds, info)


def _openvino(model: Path, threads: int, feeds: dict[str, np.ndarray],
              precision: str | None = None) -> Engine:
    """OpenVINO's CPU plugin; ``precision="f32"`` sets INFERENCE_PRECISION_HINT (the plugin
    otherwise picks bf16/f16 for float layers on CPUs that have them)."""
    ov = _import("openvino")
    core = ov.Core()
    config: dict[str, Any] = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"}
    if precision is not None:
        config["INFERENCE_PRECISION_HINT"] = precision
    _openvino_survives(model, config, feeds)
    start = time.perf_counter()
    try:
        network = core.read_model(str(model))
        compiled = core.compile_model(network, "CPU", config)
    except Exception as exc:  # noqa: BLE001 - OpenVINO's own exception types; report them
        raise EngineUnavailable(f"openvino refused the model: {exc}") from None
    seconds = time.perf_counter() - start
    request = compiled.create_infer_request()
    by_index = {index: feeds[_ov_name(port, feeds, index)]
                for index, port in enumerate(compiled.inputs)}
    ports = list(compiled.outputs)

    def run() -> object:
        return request.infer(by_index)

    def outputs() -> list[np.ndarray]:
        result = request.infer(by_index)
        return [np.asarray(result[p]) for p in ports]

    info: dict[str, Any] = {"version": ov.__version__, "INFERENCE_NUM_THREADS": threads,
                            "PERFORMANCE_HINT": "LATENCY"}
    for key in ("INFERENCE_PRECISION_HINT", "NUM_STREAMS"):
        try:
            info[key] = str(compiled.get_property(key))
        except Exception as exc:  # noqa: BLE001 - a property this OpenVINO does not report
            log.debug("openvino property %s: %s", key, exc)
    info.update(openvino_precisions(compiled))
    if info["compute_layers"] and info["compute_int8"] < info["compute_layers"]:
        log.warning("openvino ran %d of %d compute layers outside int8",
                    info["compute_layers"] - info["compute_int8"], info["compute_layers"])
    return Engine("openvino" if precision is None else f"openvino-{precision}", run, outputs,
                  seconds, info)


# Compiles and runs the model once: argv = model, config (k=v ...); feeds in FEEDS (.npz).
_OV_PROBE = """
import sys, numpy as np, openvino as ov
model, feeds, *pairs = sys.argv[1:]
config = dict(p.split("=", 1) for p in pairs)
core = ov.Core()
compiled = core.compile_model(core.read_model(model), "CPU", config)
arrays = dict(np.load(feeds))
compiled.create_infer_request().infer({p.any_name: arrays[p.any_name] for p in compiled.inputs
                                       if p.any_name in arrays} or list(arrays.values()))
"""
OV_PROBE_SECONDS = 600


def _openvino_survives(model: Path, config: dict[str, Any], feeds: dict[str, np.ndarray]
                       ) -> None:
    """Raise EngineUnavailable when OpenVINO dies (a signal) compiling or running ``model`` in
    a child process; its own Python errors are left for the in-process call to report."""
    with tempfile.TemporaryDirectory(prefix="qfuse-ov-") as tmp:
        path = Path(tmp) / "feeds.npz"
        np.savez(path, **feeds)
        args = [sys.executable, "-c", _OV_PROBE, str(model), str(path),
                *(f"{k}={v}" for k, v in config.items())]
        try:
            done = subprocess.run(args, capture_output=True, timeout=OV_PROBE_SECONDS)
        except subprocess.TimeoutExpired:
            raise EngineUnavailable(f"openvino did not compile and run the model in "
                                    f"{OV_PROBE_SECONDS} s") from None
    if done.returncode < 0:
        try:
            name = signal.Signals(-done.returncode).name
        except ValueError:
            name = f"signal {-done.returncode}"
        raise EngineUnavailable(f"openvino crashed ({name}) compiling or running the model "
                                "(checked in a child process)")


def _ov_name(port: Any, feeds: dict[str, np.ndarray], index: int) -> str:
    """The feed for an OpenVINO input port: by one of its names, else by position."""
    names = set(port.get_names())
    for name in feeds:
        if name in names:
            return name
    return list(feeds)[index]


def _rt(info: Any, key: str) -> str:
    try:
        value = info[key]
    except (KeyError, IndexError, RuntimeError):
        return "?"
    return value.astype(str) if hasattr(value, "astype") else str(value)


def openvino_precisions(compiled: Any) -> dict[str, Any]:
    """Runtime precisions of the executed graph: layer counts per precision, and how many
    compute layers (conv / fully connected / matmul) ran in I8/U8, with their primitive types."""
    by_precision: Counter[str] = Counter()
    primitives: Counter[str] = Counter()
    compute = compute_int8 = 0
    for op in compiled.get_runtime_model().get_ordered_ops():
        rt = op.get_rt_info()
        layer = _rt(rt, "layerType")
        if layer in _OV_SKIP:
            continue
        precision = _rt(rt, "runtimePrecision").lower()
        by_precision[precision] += 1
        if any(layer.startswith(c) for c in _OV_COMPUTE):
            compute += 1
            compute_int8 += precision in ("i8", "u8")
            primitives[_rt(rt, "primitiveType")] += 1
    layers = sum(by_precision.values())
    int8 = by_precision.get("i8", 0) + by_precision.get("u8", 0)
    return {"layers": layers, "layers_int8": int8, "layers_by_precision": dict(by_precision),
            "compute_layers": compute, "compute_int8": compute_int8,
            "compute_primitives": dict(primitives.most_common())}


def engine_note(engine: Engine) -> str:
    """One short line for the table's notes column."""
    info = engine.info
    if engine.name == "openvino":
        top = next(iter(info.get("compute_primitives", {})), "")
        return (f"int8 compute {info.get('compute_int8')}/{info.get('compute_layers')}, "
                f"I8/U8 layers {info.get('layers_int8')}/{info.get('layers')}"
                + (f", {top}" if top else ""))
    if "kernels" in info:
        note = f"{info['kernels']} kernels, {info['reorders']} reorders"
        if info["ref_kernels"] or info["numpy_kernels"]:
            note += f", {info['ref_kernels']} ref, {info['numpy_kernels']} numpy"
        if info["onnxruntime_kernels"]:
            note += f", {info['onnxruntime_kernels']} onnxruntime"
        return note
    if engine.name == "onnxruntime":
        return f"ort {info.get('version')}"
    return ""
