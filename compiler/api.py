"""Public Python entry points.

``compile_model(path_or_model, mode=...)`` returns a ``CompiledModel`` whose ``run`` takes and
returns dictionaries of numpy arrays keyed by the model's tensor names. ``import_graph`` gives
the imported IR (before any pass) for tools that want to look at it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from qfuse.compiler.errors import InputError
from qfuse.compiler.onnx_import import import_model
from qfuse.ir import Graph
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

    @property
    def inputs(self) -> list[str]:
        return list(self.graph.inputs)

    @property
    def outputs(self) -> list[str]:
        return list(self.graph.outputs)

    def input_specs(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        return {n: (self.graph.info(n).shape, self.graph.info(n).dtype.np) for n in self.inputs}

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self._runner(feeds)

    def run_all(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Every value the plan materializes (by name), for comparisons; oneDNN modes only."""
        if self.executor is None:
            raise NotImplementedError(f"mode {self.mode!r} has no plan to read values from")
        return self.executor.run_all(feeds)

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
) -> CompiledModel:
    """Compile ``model`` for ``mode`` (one of MODES); ``threads``: oneDNN's thread count."""
    if mode not in MODES:
        raise InputError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    mode = Mode(mode)
    graph = import_graph(model, input_shapes=input_shapes)
    from qfuse.compiler.onnx_import.islands import describe as islands

    if mode == "reference":
        from qfuse.runtime.reference import evaluate

        return CompiledModel(graph, mode, lambda feeds: evaluate(graph, feeds),
                             {"mode": mode, "islands": islands(graph)})
    from qfuse.compiler.fusion_report import not_fused
    from qfuse.compiler.lower import Options, lower
    from qfuse.compiler.modes import run_passes
    from qfuse.passes.base import PassContext
    from qfuse.runtime.executor import Executor

    work = graph.copy()
    ctx = PassContext(composer=composer or ComposerOptions())
    results = run_passes(work, mode, ctx)
    onnx_rounding = not ctx.composer.on("zero_point_before_round")
    plan = lower(work, Options(mode=mode, threads=threads, onnx_rounding=onnx_rounding))
    executor = Executor(plan, threads)
    details = {"mode": mode, **plan.inspect(), "not_fused": not_fused(work, results),
               "passes": {r.name: r.changed for r in results}, "islands": islands(work)}
    for kernel in details["kernels"]:  # no VNNI: how each int8 kernel stays exact
        if kernel["name"] in details.get("exact_int8", {}):
            kernel["exact_int8"] = details["exact_int8"][kernel["name"]]
    return CompiledModel(graph, mode, executor.run, details, work, plan, executor)


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
