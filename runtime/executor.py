"""Run a Plan: write the inputs, execute the bound kernels in order, read the outputs.

``run`` validates the feeds (names, shapes, dtypes: an InputError naming the input; no implicit
casts), takes an idle ``ExecutionContext`` (runtime/execution.py: buffers, memories, stream,
kernels bound once to them) from the executor's pool, copies the feeds in, runs, returns
copies of the outputs in plain row-major layout and puts the context back. No allocation
happens per kernel, and none per run once the pool holds a context for every concurrent caller.

Thread safety: ``run`` and ``run_all`` may be called from any number of threads at once. Each
call has a context of its own (the pool is a list: ``pop`` and ``append`` are atomic), so no
two calls share a buffer, a scratchpad or a stream; a new context is made only when every
existing one is busy, so the pool grows to the largest number of concurrent calls and no more.
The first context is made with the Executor (binding errors show at compile time).

Threads of oneDNN: ``threads`` sets the OpenMP team size (``omp_set_num_threads`` of the
libgomp oneDNN uses) on the calling thread before each run; None leaves the library default.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from qfuse.ir.errors import InputError
from qfuse.runtime.execution import ExecutionContext, read_slot, write_slot
from qfuse.runtime.onednn import set_num_threads
from qfuse.runtime.onednn.threads import MAX_THREADS

if TYPE_CHECKING:
    from qfuse.compiler.lower.plan import Plan

log = logging.getLogger(__name__)


class Executor:
    def __init__(self, plan: Plan, threads: int | None = None) -> None:
        if threads is not None and not 1 <= threads <= MAX_THREADS:
            raise InputError(f"threads must be 1..{MAX_THREADS}, got {threads}")
        self.plan = plan
        self.threads = threads
        self.input_names = list(plan.inputs)
        self.output_names = list(plan.outputs)
        first = ExecutionContext(plan)
        self._specs = [(name, view.shape, view.dtype) for name, view in first.inputs]
        self._idle: list[ExecutionContext] = [first]

    def acquire(self) -> ExecutionContext:
        """An idle context, made if none is (give it back with ``release``)."""
        try:
            return self._idle.pop()
        except IndexError:
            log.debug("plan %s: new execution context", self.plan.name)
            return ExecutionContext(self.plan)

    def release(self, context: ExecutionContext) -> None:
        self._idle.append(context)

    @property
    def contexts(self) -> int:
        """Idle contexts in the pool (all of them when no call is running)."""
        return len(self._idle)

    def input_specs(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        return {name: (shape, dtype) for name, shape, dtype in self._specs}

    def validate(self, feeds: Mapping[str, np.ndarray]) -> None:
        """An InputError naming the first bad feed (names, shapes, dtypes), else nothing."""
        self._check(feeds)

    def _check(self, feeds: Mapping[str, np.ndarray]) -> None:
        unknown = sorted(set(feeds) - set(self.input_names))
        if unknown:
            raise InputError(f"unknown input(s) {unknown}; the model's inputs are "
                             f"{self.input_names}")
        for name, shape, dtype in self._specs:
            if name not in feeds:
                raise InputError(f"input '{name}' is missing (expected {dtype}{list(shape)})")
            array = feeds[name]
            if not isinstance(array, np.ndarray):  # InputError for every bad feed (API contract)
                raise InputError(
                    f"input '{name}' must be a numpy array, got {type(array).__name__}")
            if array.shape != shape or array.dtype != dtype:
                raise InputError(f"input '{name}': got {array.dtype}{list(array.shape)}, "
                                 f"the model wants {dtype}{list(shape)}")

    def _captures(self) -> dict[int, list[str]]:
        """{kernel index: the graph values whose slot numpy can read right after it}; -1: the
        graph inputs. A value lives in its home slot, or in a view of a slot a kernel writes
        (a zero-copy Reshape); a value no kernel writes as a whole (a zero-copy Concat's
        output, written through its inputs' views) is not listed."""
        plan = self.plan
        by_slot: dict[str, list[str]] = {}
        for value, slot in plan.homes.items():
            by_slot.setdefault(slot, []).append(value)
        writer = {s: i for i, k in enumerate(plan.kernels) for s in k.writes}
        writer.update(_written_through_aliases(plan, writer))
        capture: dict[int, list[str]] = {-1: list(plan.inputs)}
        for slot, values in by_slot.items():
            root = slot
            while root not in writer and plan.slots[root].alias is not None:
                root = plan.slots[root].alias  # type: ignore[assignment]
            if root in writer or slot in plan.inputs.values():
                capture.setdefault(writer.get(root, -1), []).extend(values)
        return capture

    def run_all(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Like ``run``, plus a copy of every graph value whose slot numpy can view, taken
        right after the kernel that wrote it (buffers are reused later). Slow; for compare."""
        return self.run_forced(feeds, {})

    def run_forced(self, feeds: Mapping[str, np.ndarray], forced: Mapping[str, np.ndarray]
                   ) -> dict[str, np.ndarray]:
        """``run_all`` with teacher forcing: right after the kernel that writes a value named
        in ``forced``, the value it computed is kept for the result and ``forced[value]`` is
        written over it, so every later kernel reads the forced value instead (each kernel
        fed another engine's inputs: compiler/op_check.py). A forced array must have the
        value's shape and dtype. Values in non-plain layouts go through a oneDNN reorder."""
        self._check(feeds)
        if self.threads is not None:
            set_num_threads(self.threads)
        plan = self.plan
        capture = self._captures()
        found: dict[str, np.ndarray] = {}
        context = self.acquire()
        try:
            def take(index: int) -> None:
                for value in capture.get(index, ()):
                    slot = plan.homes.get(value, value)
                    found[value] = read_slot(context, slot)
                    if value in forced and index >= 0:
                        write_slot(context, slot, forced[value], value)

            for name, view in context.inputs:
                np.copyto(view, feeds[name])
            take(-1)
            for index, run in enumerate(context.runs):
                run()
                context.stream.wait()
                take(index)
            for name, view in context.outputs:
                if name not in forced:
                    found[name] = view.copy()
            found.update((name, cell.take()) for name, cell in plan.dynamic.items())
        finally:
            self.release(context)
        return found

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self._check(feeds)
        if self.threads is not None:
            set_num_threads(self.threads)
        context = self.acquire()
        try:
            for name, view in context.inputs:
                np.copyto(view, feeds[name])
            context.execute_kernels()
            context.stream.wait()
            results = {name: view.copy() for name, view in context.outputs}
            results.update((name, cell.take()) for name, cell in self.plan.dynamic.items())
            return results
        finally:
            self._idle.append(context)


def _written_through_aliases(plan: Plan, writer: dict[str, int]) -> dict[str, int]:
    """Slots no kernel writes itself but kernels write through slots aliasing them (an
    in-place concat's output, compiler/lower/in_place_concat.py): the index of the last such
    write before the first kernel reading the slot or an alias of it. A view of a slot some
    kernel writes (a zero-copy Reshape or Transpose) is not one: its value is complete when
    that slot is written, and a later kernel writing through it (an in-place sum into the
    view, its own output aliasing the view) overwrites it."""
    def chain(name: str) -> list[str]:
        out = []
        while (alias := plan.slots[name].alias) is not None:
            out.append(alias)
            name = alias
        return out

    homes = set(plan.homes.values())
    writes: dict[str, list[int]] = {}
    first_read: dict[str, int] = {}
    for index, kernel in enumerate(plan.kernels):
        for name in kernel.reads:  # a slot, or a view of it no kernel writes (a Reshape)
            for slot in (name, *(chain(name) if name not in writer else ())):
                # a view of an in-place concat input's part does not read the whole output
                if _covers(plan, name, slot):
                    first_read.setdefault(slot, index)
        for name in kernel.writes:
            root = plan.root(name)[0]
            if name in homes and name != root and _covers(plan, name, root):
                # another value written over all of these bytes (an in-place residual sum's
                # dst over its residual, which it reads first): the value there is complete
                for slot in chain(name):
                    first_read.setdefault(slot, index)
                continue
            for slot in chain(name):
                if slot not in writer and not any(s in writer for s in chain(slot)):
                    writes.setdefault(slot, []).append(index)
    found = {}
    for slot, indices in writes.items():
        before = [i for i in indices if i < first_read.get(slot, len(plan.kernels))]
        if before:
            found[slot] = max(before)
    return found


def _covers(plan: Plan, name: str, slot: str) -> bool:
    """Slot ``name``'s bytes include all of slot ``slot``'s (the same buffer)."""
    (root, start), (other, at) = plan.root(name), plan.root(slot)
    return root == other and start <= at and (
        start + plan.slots[name].md.size >= at + plan.slots[slot].md.size)
