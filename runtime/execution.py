"""Execution contexts: the run-time state of one caller of a compiled Plan.

A Plan is immutable once compiled: kernels (primitives with their constant arguments: weights,
scales, zero points), slot descriptors, and the buffer plan (which slot lives at which byte
offset of which buffer). Everything a run writes lives in an ``ExecutionContext``:

- the activation buffers (``plan.buffers.sizes``, 64-byte aligned) and one oneDNN memory per
  non-constant slot over them;
- the scratchpad (``plan.scratchpad_bytes``, shared by the context's kernels, which run one
  after the other) and one SCRATCHPAD memory per primitive over it;
- an in-order oneDNN stream;
- every primitive bound once to those memories (``Primitive.bind``), and the numpy views of
  the graph inputs and outputs.

Concurrency contract (oneDNN 3.2): a primitive may be executed from several threads at once as
long as each execution has its own scratchpad (scratchpad mode ``user``: "thread-safe as long
as the scratchpad buffers are not used concurrently by two primitive executions",
https://oneapi-src.github.io/oneDNN/enum_dnnl_scratchpad_mode_t.html) and its own dst; a stream
is used by one thread at a time. Constant memories are only read, so all contexts share them.
One context is used by one call at a time; ``Executor`` keeps a pool of idle contexts.

Buffers start zeroed. A context reads nothing it has not written in the same run (a test
fills fresh buffers with garbage and compares), so its first run equals every later one — but
for the border of a padded source (``Slot.fill``): its buffer starts filled with that byte,
and no kernel writes the border, so every run reads the same border.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from qfuse.runtime.onednn import Arg, Memory, MemoryDesc, Stream
from qfuse.runtime.onednn.threads import team
from qfuse.runtime.onednn._lib import check
from qfuse.runtime.onednn.primitive import BoundPrimitive

if TYPE_CHECKING:
    from qfuse.compiler.lower.plan import Kernel, Plan

log = logging.getLogger(__name__)

ALIGNMENT = 64  # bytes, what oneDNN uses for the buffers it allocates itself


def aligned_bytes(nbytes: int, fill: int | None = None) -> np.ndarray:
    """``nbytes`` zeroed (or ``fill``-ed) bytes starting on an ALIGNMENT boundary."""
    raw = np.zeros(nbytes + ALIGNMENT, dtype=np.uint8)
    if fill is not None:
        raw.fill(fill)
    start = (-raw.ctypes.data) % ALIGNMENT
    return raw[start:start + nbytes]


class ExecutionContext:
    """Buffers, memories, stream and bound kernels for running ``plan`` from one thread.

    ``fill`` (tests only) fills the activation buffers and the scratchpad with that byte
    instead of zeros: a plan whose outputs depend on it reads memory it did not write.
    """

    def __init__(self, plan: Plan, fill: int | None = None) -> None:
        self.plan = plan
        buffers = plan.buffers
        self.stream = Stream()
        # a padded source's buffer starts (and its border stays) at its own byte
        self._arrays = [aligned_bytes(n, buffers.fills.get(i, fill))
                        for i, n in enumerate(buffers.sizes)]
        self.memories: dict[str, Memory] = {}
        for name, slot in plan.slots.items():
            if slot.const is not None:
                self.memories[name] = slot.const
                continue
            root, offset = plan.root(name)
            buffer = self._arrays[buffers.buffer_of[root]]
            self.memories[name] = Memory(slot.md, buffer[offset:offset + slot.md.size])
        scratch = plan.scratchpad_bytes
        self._scratchpad = aligned_bytes(scratch, fill) if scratch else None
        # per kernel a closure that runs it (``runs``: profiling, run_all) and, for the run
        # loop, ``(function, arguments)`` whose call returns 0 on success (``calls``): a
        # primitive's pre-converted dnnl_primitive_execute, which holds its handles' values
        # only, so ``runs`` (the bound primitives) must live as long as ``calls``
        bound = [self._bind(k) for k in plan.kernels]
        self.runs: list[Callable[[], None]] = [run for run, _ in bound]
        self.calls: list[tuple[Callable[..., Any], tuple[Any, ...]]] = [c for _, c in bound]
        self.inputs = [(name, self.view(slot)) for name, slot in plan.inputs.items()]
        self.outputs = [(name, self.view(slot)) for name, slot in plan.outputs.items()]

    def _bind(self, kernel: Kernel) -> tuple[Callable[[], None],
                                             tuple[Callable[..., Any], tuple[Any, ...]]]:
        """The kernel's closure and its ``(function, arguments)`` (``calls``)."""
        if kernel.primitive is None:
            run = self._numpy_runner(kernel)
            return run, (run, ())  # a numpy kernel returns None
        bound = self._bound(kernel)
        # No wait per primitive: the CPU engine's execute returns when the work is done (the
        # run waits once at the end); the wait and the Python wrapper cost ~1 us a kernel
        if kernel.team is not None:
            return _in_team(kernel.team, bound.runner(self.stream), bound.call(self.stream))
        return bound.runner(self.stream), bound.call(self.stream)

    def _numpy_runner(self, kernel: Kernel) -> Callable[[], None]:
        assert kernel.numpy_fn is not None
        fn = kernel.numpy_fn
        ins = [self.view(n) for n in kernel.reads]
        outs = [self.view(n) for n in kernel.writes]
        stream = self.stream

        if kernel.numpy_into:  # it fills its output views itself
            def run_into() -> None:
                stream.wait()
                fn(ins, outs)  # type: ignore[call-arg]

            return run_into

        def run_numpy() -> None:
            stream.wait()
            for out, value in zip(outs, fn(ins), strict=True):
                np.copyto(out, value, casting="unsafe")

        return run_numpy

    def _bound(self, kernel: Kernel) -> BoundPrimitive:
        assert kernel.primitive is not None
        args: dict[int, Memory] = dict(kernel.fixed)
        for arg, name in kernel.args.items():
            args[arg] = self.memories[name]
        expected = kernel.primitive.pd.expected_args.get(int(Arg.SCRATCHPAD))
        if expected is not None:
            assert self._scratchpad is not None
            args[int(Arg.SCRATCHPAD)] = Memory(expected.md,
                                               self._scratchpad[:expected.md.size])
        try:
            return kernel.primitive.bind(args)
        except ValueError as exc:
            raise RuntimeError(f"kernel '{kernel.name}': {exc}") from exc

    def view(self, slot: str) -> np.ndarray:
        """A numpy view of a plain slot's memory in this context (writes go to the buffer); a
        host slot (flat bytes oneDNN cannot describe: int64, bool, ...) as its (shape, dtype)."""
        array = self.memories[slot].array
        host = self.plan.slots[slot].host
        if host is None:
            return array
        shape, dtype = host
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return array[:nbytes].view(dtype).reshape(shape)

    def run(self) -> None:
        """Execute every kernel in order on the inputs already written; wait for the end."""
        self.execute_kernels()
        self.stream.wait()

    def execute_kernels(self) -> None:
        """Every kernel in order (no wait): the run loop. A primitive's nonzero status
        raises DnnlError naming its kernel."""
        for function, arguments in self.calls:
            status = function(*arguments)
            if status:
                self._failed(status, arguments)

    def _failed(self, status: int, arguments: tuple[Any, ...]) -> None:
        index = next(i for i, (_, a) in enumerate(self.calls) if a is arguments)
        check(status, "dnnl_primitive_execute", self.plan.kernels[index].name)


def _in_team(count: int, run: Callable[[], None],
             call: tuple[Callable[..., Any], tuple[Any, ...]]
             ) -> tuple[Callable[[], None], tuple[Callable[..., Any], tuple[Any, ...]]]:
    """``run`` and ``call`` of a kernel made for ``count`` threads (``Kernel.team``), each
    executed in a team of that size, the caller's restored after (``threads.team``)."""
    function, arguments = call

    def run_in_team() -> None:
        with team(count):
            run()

    def call_in_team(*args: Any) -> int:
        with team(count):
            return int(function(*args))

    return run_in_team, (call_in_team, arguments)


def _reorder(src: Memory, dst: Memory, stream: Stream) -> None:
    """Copy ``src`` into ``dst`` (same dims and data type, any two layouts) with a oneDNN
    reorder: how a value in a blocked or sub-memory layout is read or written from numpy."""
    from qfuse.runtime.onednn import reorder

    reorder(src.md, dst.md).create().execute({int(Arg.SRC): src, int(Arg.DST): dst}, stream)


def _plain_twin(md: MemoryDesc) -> Memory:
    return Memory(MemoryDesc.from_tag(md.dims, md.dtype))


def read_slot(context: ExecutionContext, slot: str) -> np.ndarray:
    """A row-major copy of ``slot``'s current contents in ``context`` (any layout)."""
    memory = context.memories[slot]
    if memory.md.is_plain:
        return np.array(context.view(slot))
    plain = _plain_twin(memory.md)
    _reorder(memory, plain, context.stream)
    return plain.read()


def write_slot(context: ExecutionContext, slot: str, values: np.ndarray, what: str) -> None:
    """Write ``values`` (row-major, the slot's shape and dtype) into ``slot`` in ``context``;
    ``what`` names the value in the error raised for a mismatch."""
    memory = context.memories[slot]
    if memory.md.is_plain:
        target = context.view(slot)
        if values.size == target.size == 1:  # a scalar as [] or [1] (DynamicQuantizeLinear's)
            values = values.reshape(target.shape)
        if values.shape != target.shape or values.dtype != target.dtype:
            raise ValueError(f"cannot force '{what}': {values.dtype}{list(values.shape)} into "
                             f"{target.dtype}{list(target.shape)}")
        np.copyto(target, values)
        return
    plain = _plain_twin(memory.md)
    plain.write(values)
    _reorder(plain, memory, context.stream)
