"""Public Python entry points.

``compile_model(path_or_model, mode=...)`` returns a ``CompiledModel`` whose ``run`` takes and
returns dictionaries of numpy arrays keyed by the model's tensor names. ``import_graph`` gives
the imported IR (before any pass) for tools that want to look at it.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from qfuse.compiler.errors import InputError
from qfuse.compiler.onnx_import import import_model
from qfuse.ir import Graph
from qfuse.ir.graph import in_model_order, shifted_levels
from qfuse.ir.mode import Mode
from qfuse.ir.postops import ComposerOptions

log = logging.getLogger(__name__)

MODES = tuple(Mode)
ModelLike = onnx.ModelProto | str | os.PathLike


def import_graph(
    model: ModelLike, *, input_shapes: dict[str, tuple[int, ...]] | None = None
) -> Graph:
    """The model as imported into the IR, before any pass runs."""
    return import_model(model, input_shapes=input_shapes)


@dataclass
class CompiledModel:
    """A model ready to run; ``inputs``/``outputs`` are tensor names in the model's order.

    ``graph`` is the imported graph (the model's interface); for the oneDNN modes
    ``compiled_graph`` is the graph after the passes and ``plan`` the lowered Plan.
    """

    graph: Graph
    mode: Mode
    _runner: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
    details: dict[str, Any] = field(default_factory=dict)
    compiled_graph: Graph | None = None
    plan: Any = None
    executor: Any = None
    guard: Any = None  # compiler/nonfinite.py: NaN / inf in float inputs
    # the same compile for other sizes of the dims the model leaves symbolic (``run``)
    specialize: Callable[[dict[str, tuple[int, ...]]], CompiledModel] | None = None
    _specialized: dict[tuple, CompiledModel] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def inputs(self) -> list[str]:
        return list(self.graph.inputs)

    @property
    def outputs(self) -> list[str]:
        return list(self.graph.outputs)

    def input_specs(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        return {n: (self.graph.info(n).shape, self.graph.info(n).dtype.np) for n in self.inputs}

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Outputs by name, in the model's output order. Float inputs holding NaN / inf give
        ONNX's result in every mode and a NonFiniteInputWarning once per model
        (compiler/nonfinite.py). Inputs whose dims the model leaves symbolic (a batch, a
        sequence length) may come in other sizes than the compiled ones: the model is then
        compiled again for those shapes, once per set of shapes (the last 8 kept)."""
        other = self._other_shapes(feeds)
        if other is not None:
            return self._specialization(other).run(feeds)
        out = self._runner(feeds) if self.guard is None else self.guard(feeds, self._runner)
        return {name: out[name] for name in self.outputs if name in out} | out

    def _other_shapes(self, feeds: dict[str, np.ndarray]) -> dict[str, tuple[int, ...]] | None:
        """The feeds' input shapes when they differ from the compiled ones only in dims the
        model leaves symbolic (and their rank is the model's); None otherwise (the executor
        then names any mismatch)."""
        if self.specialize is None or not self.graph.free_dims:
            return None
        shapes, differs = {}, False
        for name in self.inputs:
            array = feeds.get(name)
            compiled = self.graph.info(name).shape
            shape = tuple(getattr(array, "shape", compiled))
            if len(shape) != len(compiled):
                return None
            free = self.graph.free_dims.get(name, ())
            for i, (got, want) in enumerate(zip(shape, compiled, strict=True)):
                if got != want:
                    if i not in free:
                        return None
                    differs = True
            shapes[name] = shape
        return shapes if differs else None

    def _specialization(self, shapes: dict[str, tuple[int, ...]]) -> CompiledModel:
        assert self.specialize is not None
        key = tuple(sorted(shapes.items()))
        with self._lock:  # one compile per shape even when threads run the model at once
            model = self._specialized.pop(key, None)
            if model is None:
                log.info("compiling again for input shapes %s", shapes)
                model = self.specialize(shapes)
            self._specialized[key] = model  # most recent last
            while len(self._specialized) > 8:
                self._specialized.pop(next(iter(self._specialized)))
        return model

    def run_all(self, feeds: dict[str, np.ndarray], *, as_planned: bool = False
                ) -> dict[str, np.ndarray]:
        """Every value the plan materializes (by name), for comparisons; oneDNN modes only.
        Channels in the model's order and integers in the model's type and zero point, or
        with ``as_planned`` as the compiled graph holds them (``Graph.channel_orders``,
        passes/pair_channels.py; ``Graph.level_offsets``, an activation re-encoded by
        passes/decompose_fake_quantize.py)."""
        if self.executor is None:
            raise NotImplementedError(f"mode {self.mode!r} has no plan to read values from")
        values = self.executor.run_all(feeds)
        if self.compiled_graph is None or as_planned:
            return values
        orders, offsets = self.compiled_graph.channel_orders, self.compiled_graph.level_offsets
        model = {name: in_model_order(v, orders.get(name)) for name, v in values.items()}
        for name, (offset, dtype) in offsets.items():
            if name in model:
                model[name] = shifted_levels(model[name], -offset, dtype.np)
        return model

    def inspect(self) -> dict[str, Any]:
        """JSON-able description (docs/design.md, `qfuse inspect --json`)."""
        return dict(self.details)


def compile_model(
    model: ModelLike,
    *,
    mode: Mode | str = Mode.FUSED,
    threads: int | None = None,
    input_shapes: dict[str, tuple[int, ...]] | None = None,
    composer: ComposerOptions | None = None,
    exact_int8: bool = True,
) -> CompiledModel:
    """Compile ``model`` for ``mode`` (one of MODES); ``threads``: oneDNN's thread count.
    ``exact_int8=False``: on an int8 kernel without VNNI / AMX, run oneDNN's kernel as it is
    (u8·s8 products summed in pairs with int16 saturation, as ONNX Runtime's and OpenVINO's
    int8 kernels do there) instead of splitting its weights to keep the sum exact
    (compiler/lower/no_vnni.py): faster, not exact; inspect() says so. No effect on a CPU
    whose int8 kernels use VNNI or AMX."""
    if mode not in MODES:
        raise InputError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    mode = Mode(mode)
    from qfuse.runtime.onednn.threads import MAX_THREADS

    if threads is not None and not 1 <= threads <= MAX_THREADS:
        raise InputError(f"threads must be 1..{MAX_THREADS}, got {threads}")
    graph = import_graph(model, input_shapes=input_shapes)
    compiled = _compile(graph, mode, threads, composer, exact_int8)
    if graph.free_dims:
        def specialize(shapes: dict[str, tuple[int, ...]]) -> CompiledModel:
            return _compile(import_graph(model, input_shapes=shapes), mode, threads, composer,
                            exact_int8)

        compiled.specialize = specialize
    return compiled


def _compile(graph: Graph, mode: Mode, threads: int | None, composer: ComposerOptions | None,
             exact_int8: bool) -> CompiledModel:
    """``compile_model`` for the imported ``graph`` (its input shapes fixed)."""
    from qfuse.compiler.onnx_import.islands import describe as islands

    from qfuse.compiler.nonfinite import NonFiniteGuard
    from qfuse.runtime.reference import evaluate

    if mode == "reference":
        return CompiledModel(graph, mode, lambda feeds: evaluate(graph, feeds),
                             {"mode": mode, "islands": islands(graph)},
                             guard=NonFiniteGuard(graph, mode, None))
    from qfuse.compiler.fusion_report import not_fused
    from qfuse.compiler.lower import Options, lower
    from qfuse.compiler.modes import run_passes
    from qfuse.passes.base import PassContext
    from qfuse.runtime.executor import Executor
    from qfuse.runtime.onednn.threads import team

    work = graph.copy()
    from qfuse.compiler.lower.lower_compute import depthwise_binary_block
    from qfuse.compiler.lower.no_vnni import isa_is_exact

    composer = composer or ComposerOptions()
    ctx = PassContext(composer=composer, unsigned_activations=(
        composer.on("unsigned_activations") and not isa_is_exact()),
        split_int8_deconvolutions=exact_int8 and not isa_is_exact(),
        pair_input_channels=(composer.on("pair_channels") and exact_int8
                             and not isa_is_exact()),
        depthwise_binary_block=depthwise_binary_block())
    results = run_passes(work, mode, ctx)
    onnx_rounding = not ctx.composer.on("zero_point_before_round")
    with team(threads):  # the primitives are made for the threads they will run with
        plan = lower(work, Options(mode=mode, threads=threads, onnx_rounding=onnx_rounding,
                                   exact_int8=exact_int8,
                                   in_place_concat=ctx.composer.on("in_place_concat"),
                                   merge_copies=ctx.composer.on("merge_copies"),
                                   sum_in_place=ctx.composer.on("sum_in_place"),
                                   direct_int8=ctx.composer.on("direct_int8"),
                                   linear_resampling=ctx.composer.on("linear_resampling"),
                                   padded_depthwise=ctx.composer.on("padded_depthwise"),
                                   conv_windows=ctx.composer.on("conv_windows"),
                                   fold_stride=ctx.composer.on("fold_stride")))
        executor = Executor(plan, threads)
    from qfuse.compiler.concat_report import concat_report

    dropped = not_fused(work, results)
    details = {"mode": mode, **plan.inspect(), "not_fused": dropped,
               "concats": concat_report(work, plan.notes.get("concats", []), dropped),
               "passes": {r.name: r.changed for r in results}, "islands": islands(work)}
    native = {k["node"]: k for k in details["kernels"]
              if k["primitive"] not in ("island", "numpy", "onnxruntime")}
    for island in details["islands"]:  # lowered after all (an LSTM as oneDNN's RNN)
        kernel = native.get(island["name"])
        if kernel is not None:
            island["engine"] = f"oneDNN {kernel['primitive']} ({kernel['impl']})"
    for kernel in details["kernels"]:  # no VNNI: how each int8 kernel stays exact
        if kernel["name"] in details.get("exact_int8", {}):
            kernel["exact_int8"] = details["exact_int8"][kernel["name"]]
    guard = NonFiniteGuard(graph, mode, _onnx_fallback(graph, mode), work, executor.validate)
    return CompiledModel(graph, mode, executor.run, details, work, plan, executor, guard)


def _onnx_fallback(graph: Graph, mode: Mode) -> Callable[[dict[str, np.ndarray]],
                                                          dict[str, np.ndarray]]:
    """The reference interpreter on the ONNX graph a mode stands for (runs with NaN / inf
    inputs, compiler/nonfinite.py): the imported graph, or for fp32 the imported graph with
    quantization stripped and nothing fused (a fused chain models oneDNN's eltwise formulas,
    where relu(-inf) is NaN)."""
    from qfuse.runtime.reference import evaluate

    stripped: list[Graph] = []

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if mode is not Mode.FP32:
            return evaluate(graph, feeds)
        if not stripped:
            from qfuse.passes import strip_quantization
            from qfuse.passes.base import PassContext

            copy = graph.copy()
            strip_quantization.run(copy, PassContext())
            stripped.append(copy)
        return evaluate(stripped[0], feeds)

    return run


def random_inputs(model: CompiledModel, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs of the model's shapes and types, drawn from a fixed seed."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, (shape, dtype) in model.input_specs().items():
        if dtype.kind == "f":
            feeds[name] = rng.standard_normal(shape).astype(dtype)
        else:
            info = np.iinfo(dtype) if dtype.kind in "iu" else None
            lo, hi = (0, 2) if info is None else (max(info.min, -128), min(info.max, 127))
            feeds[name] = rng.integers(lo, hi, size=shape, endpoint=True).astype(dtype)
    return feeds
