"""Run a Plan: write the inputs, execute the bound kernels in order, read the outputs.

Everything is prepared when the Executor is built: numpy views of the input and output
buffers, the list of kernel closures (each one ``dnnl_primitive_execute`` on a fixed argument
array, or a numpy function on fixed views). ``run`` validates the feeds (names, shapes, dtypes:
a ValueError naming the input; no implicit casts), copies them in, runs, and returns copies of
the outputs in plain row-major layout. No allocation happens per kernel.

Threads: ``threads`` sets oneDNN's OpenMP team size (``omp_set_num_threads`` of the libgomp
oneDNN uses) on the calling thread before each run; None leaves the library default.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import numpy as np

from qfuse.ir.errors import InputError
from qfuse.runtime.onednn import set_num_threads

if TYPE_CHECKING:
    from qfuse.compiler.lower.plan import Plan

log = logging.getLogger(__name__)


class Executor:
    def __init__(self, plan: Plan, threads: int | None = None) -> None:
        if threads is not None and threads < 1:
            raise InputError(f"threads must be >= 1, got {threads}")
        self.plan = plan
        self.threads = threads
        self.input_names = list(plan.inputs)
        self.output_names = list(plan.outputs)
        self._inputs = [(name, plan.view(slot)) for name, slot in plan.inputs.items()]
        self._outputs = [(name, plan.view(slot)) for name, slot in plan.outputs.items()]
        self._runs: list[Callable[[], None]] = []
        for kernel in plan.kernels:
            assert kernel.run is not None, f"kernel {kernel.name} is not bound"
            self._runs.append(kernel.run)
        assert plan.stream is not None
        self._stream = plan.stream

    def input_specs(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        return {name: (view.shape, view.dtype) for name, view in self._inputs}

    def _check(self, feeds: Mapping[str, np.ndarray]) -> None:
        unknown = sorted(set(feeds) - set(self.input_names))
        if unknown:
            raise InputError(f"unknown input(s) {unknown}; the model's inputs are "
                             f"{self.input_names}")
        for name, view in self._inputs:
            if name not in feeds:
                raise InputError(f"input '{name}' is missing (expected {view.dtype}"
                                 f"{list(view.shape)})")
            array = feeds[name]
            if not isinstance(array, np.ndarray):  # InputError for every bad feed (API contract)
                raise InputError(
                    f"input '{name}' must be a numpy array, got {type(array).__name__}")
            if array.shape != view.shape or array.dtype != view.dtype:
                raise InputError(f"input '{name}': got {array.dtype}{list(array.shape)}, "
                                 f"the model wants {view.dtype}{list(view.shape)}")

    def run_all(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Like ``run``, plus a copy of every graph value whose slot numpy can view, taken
        right after the kernel that wrote it (buffers are reused later). Slow; for compare."""
        self._check(feeds)
        plan = self.plan
        for name, view in self._inputs:
            np.copyto(view, feeds[name])
        by_slot: dict[str, list[str]] = {}
        for value, slot in plan.homes.items():
            by_slot.setdefault(slot, []).append(value)
        writer = {s: i for i, k in enumerate(plan.kernels) for s in k.writes}
        capture: dict[int, list[str]] = {-1: list(plan.inputs)}
        for slot, values in by_slot.items():
            root = slot
            while root not in writer and plan.slots[root].alias is not None:
                root = plan.slots[root].alias  # type: ignore[assignment]
            if root in writer or slot in plan.inputs.values():
                capture.setdefault(writer.get(root, -1), []).extend(values)
        found: dict[str, np.ndarray] = {}

        def take(index: int) -> None:
            for value in capture.get(index, ()):
                slot = plan.homes.get(value, value)
                memory = plan.slots[slot].memory
                if memory is not None and memory.md.is_plain:
                    found[value] = np.array(memory.array)

        take(-1)
        for index, run in enumerate(self._runs):
            run()
            self._stream.wait()
            take(index)
        for name, view in self._outputs:
            found[name] = view.copy()
        return found

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self._check(feeds)
        if self.threads is not None:
            set_num_threads(self.threads)
        for name, view in self._inputs:
            np.copyto(view, feeds[name])
        for run in self._runs:
            run()
        self._stream.wait()
        return {name: view.copy() for name, view in self._outputs}
