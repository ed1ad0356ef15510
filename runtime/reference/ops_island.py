"""Float islands: an ONNX subgraph evaluated as written, by onnxruntime or onnx.reference.

An island (ir.ops.IslandAttrs) holds a serialized ONNX model whose inputs and outputs are the
island node's inputs and outputs in port order. Its semantics are the ONNX operator specs
(https://onnx.ai/onnx/operators/) of the nodes inside, computed by the engine the importer chose
for it (compiler/onnx_import/islands.py): onnxruntime when it can open the island, else
``onnx.reference.ReferenceEvaluator``. Every mode, the reference interpreter included, runs
the island on that engine, so the modes agree on islands. onnxruntime comes first because
onnx.reference has gaps that silently change results (onnx 1.23 evaluates an opset-11 Softmax
on the last axis instead of the flattened dims from ``axis``; it fails on some Scan bodies).

onnxruntime sessions are created with ``GraphOptimizationLevel.ORT_DISABLE_ALL``: an island
computes what its nodes say one by one, without the fusions ORT would otherwise apply (its
GELU / LayerNorm / MatMul+Add fusions round differently from the node-by-node float32
result), so the fused and reference modes agree on islands to float32 rounding. The session
holds no per-run state (``InferenceSession.run`` is thread-safe), and neither does the runner.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import onnx

from qfuse.ir.errors import QfuseError
from qfuse.ir.graph import Node
from qfuse.ir.ops import IslandAttrs, IslandEngine, Op
from qfuse.runtime.reference.registry import Arrays, impl

Runner = Callable[[list[np.ndarray]], list[np.ndarray]]


class IslandError(QfuseError, RuntimeError):
    """The engine failed while running an island; the message names the island's ops."""


def new_ort_session(model: bytes, threads: int | None = None):
    """An onnxruntime CPU session over an island model (module docstring: no optimization),
    not cached: for a model run once (an island of constants computed at import)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4  # fatal only: a failure reaches the caller as an exception
    options.intra_op_num_threads = threads or 1
    options.inter_op_num_threads = 1
    # ORT's pool threads would spin-wait after each run on the cores oneDNN's OpenMP threads
    # run on next: measured on BERT-base-like QDQ with two GELU Erf islands, 2 threads,
    # 41.8 ms per run spinning against 16.6 ms without
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


@functools.lru_cache(maxsize=32)
def ort_session(model: bytes, threads: int | None = None):
    """``new_ort_session``, cached: the importer opens it to choose the engine and the
    lowering runs it; a session is immutable once created and ``run`` is thread-safe, so
    compiled models may share one."""
    return new_ort_session(model, threads)


def reference_evaluator(model: bytes) -> onnx.reference.ReferenceEvaluator:
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(onnx.load_from_string(model))


def input_names(model: bytes) -> list[str]:
    return [i.name for i in _graph_io(model)[0]]


@functools.lru_cache(maxsize=256)
def _graph_io(model: bytes) -> tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto]]:
    proto = onnx.load_from_string(model)
    return list(proto.graph.input), list(proto.graph.output)


def make_runner(attrs: IslandAttrs, engine: IslandEngine | None = None,
                threads: int | None = None) -> Runner:
    """A function from the island's input arrays to its output arrays (port order)."""
    engine = engine or attrs.engine
    names = input_names(attrs.model)
    outputs = [o.name for o in _graph_io(attrs.model)[1]]
    if engine is IslandEngine.ONNXRUNTIME:
        run = functools.partial(ort_session(attrs.model, threads).run, outputs)
    else:
        run = functools.partial(reference_evaluator(attrs.model).run, outputs)
    ops = ", ".join(sorted(set(attrs.ops)))

    def run_island(arrays: list[np.ndarray]) -> list[np.ndarray]:
        try:
            results = run(dict(zip(names, arrays, strict=True)))
        except Exception as exc:
            raise _failed(ops, engine, exc) from exc
        return [np.asarray(r) for r in results]

    return run_island


def _failed(ops: str, engine: IslandEngine, exc: Exception) -> IslandError:
    """The one-line error of an island's failed run."""
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    return IslandError(f"island of {ops} ({engine.value}) failed: "
                       f"{type(exc).__name__}: {first}")


def make_runner_into(attrs: IslandAttrs, threads: int | None = None
                     ) -> Callable[[list[np.ndarray], list[np.ndarray]], None]:
    """``runner_into`` for an island (every output static-shaped)."""
    return runner_into(attrs.model, ", ".join(sorted(set(attrs.ops))), threads)


def runner_into(model: bytes, ops: str, threads: int | None = None
                ) -> Callable[[list[np.ndarray], list[np.ndarray]], None]:
    """onnxruntime running ``model`` (its op types ``ops``, for errors) and writing its
    outputs straight into ``outs`` (its IOBinding over the caller's contiguous arrays, which
    must have the outputs' shapes and types): no output allocation, whose fresh pages cost
    more than ONNX Runtime's Erf itself on a large tensor, and no copy after. Inputs are
    bound the same way."""
    session = ort_session(model, threads)
    names = input_names(model)
    outputs = [o.name for o in _graph_io(model)[1]]
    # A binding over the same arrays is made once and run again (about 6 us a call less):
    # a compiled plan calls with the same views of its context's buffers every run. Keyed
    # by the arrays' addresses, shapes and types; each context has its own buffers, so
    # concurrent runs (one context each) never share a binding.
    bindings: dict[tuple, object] = {}

    def run_into(arrays: list[np.ndarray], outs: list[np.ndarray]) -> None:
        # contiguous (0-d kept 0-d), alive until the run returns
        given = list(map(np.asarray, arrays))
        kept = [a if a.flags.c_contiguous else np.ascontiguousarray(a).reshape(a.shape)
                for a in given]
        key = None
        if all(k is g for k, g in zip(kept, given, strict=True)):
            key = tuple((a.ctypes.data, a.shape, a.dtype.str) for a in [*kept, *outs])
        binding = bindings.get(key) if key is not None else None
        if binding is None:
            binding = _bind(session, names, kept, outputs, outs, ops)
            if key is not None and len(bindings) < 64:
                bindings[key] = binding
        try:
            session.run_with_iobinding(binding)
        except Exception as exc:
            raise _failed(ops, IslandEngine.ONNXRUNTIME, exc) from exc

    return run_into


def _bind(session, names: list[str], arrays: list[np.ndarray], outputs: list[str],
          outs: list[np.ndarray], ops: str):
    """An IOBinding of ``session`` over contiguous ``arrays`` and ``outs``."""
    binding = session.io_binding()
    for name, array in zip(names, arrays, strict=True):
        binding.bind_input(name, "cpu", 0, array.dtype, array.shape, array.ctypes.data)
    for name, out in zip(outputs, outs, strict=True):
        if not out.flags.c_contiguous:
            raise IslandError(f"island of {ops}: output '{name}' is not contiguous")
        binding.bind_output(name, "cpu", 0, out.dtype, out.shape, out.ctypes.data)
    return binding


@functools.lru_cache(maxsize=64)
def _runner(attrs: IslandAttrs) -> Runner:
    return make_runner(attrs)


@impl(Op.ISLAND)
def island(node: Node, args: Arrays) -> list[np.ndarray]:
    attrs: IslandAttrs = node.attrs
    arrays = [np.asarray(a) for a in args if a is not None]
    return _runner(attrs)(arrays)
