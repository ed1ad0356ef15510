"""The Plan: what the runtime executes — ordered kernels over planned buffers.

A *slot* is one memory descriptor over a byte range: the value a kernel writes or reads, in the
layout the kernel uses. Several slots may share one buffer (``alias``): a zero-copy Reshape, the
dst of a convolution whose sum post-op reads the residual in place, a strided view that Split /
Slice read from. A *kernel* is one bound oneDNN primitive, or a numpy fallback that reads and
writes plain arrays.

Buffer planning (``plan_buffers``), done once at compile time: every alias group (the slots
sharing a root) lives from the first kernel that writes any of its slots to the last kernel
that reads any of them (graph inputs from before the first kernel, graph outputs to the end).
Kernels are walked in order; before kernel i the groups it starts are given the smallest free
buffer that fits (or the largest free one, grown, or a new one), after kernel i the groups whose
last reader it was return their buffer to the pool. A kernel's outputs therefore never share a
buffer with its inputs except through an explicit alias. All primitives share one scratchpad
of ``scratchpad_bytes`` (the largest any kernel asks for). A padded source
(``Slot.fill``, lower_compute's padded_depthwise) takes a buffer of its own for the whole run,
never pooled: its border holds the fill byte the execution context sets once.

A Plan, its slots and its kernels are immutable once built (frozen dataclasses): the buffer
plan and the scratchpad size are computed when the Plan is made, and it holds no buffer,
memory or stream. runtime/execution.py allocates those per caller (an ``ExecutionContext``)
and binds the primitives to them there, so one Plan runs from many threads at once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from qfuse.runtime.onednn import Arg, Memory, MemoryDesc, Primitive

log = logging.getLogger(__name__)

NumpyFn = Callable[[list[np.ndarray]], list[np.ndarray]]


@dataclass(frozen=True)
class Slot:
    """A memory descriptor over a planned buffer (or over a constant's own memory)."""

    name: str
    md: MemoryDesc
    alias: str | None = None  # shares the buffer of this slot, at byte ``offset`` of its root
    offset: int = 0
    const: Memory | None = None  # a constant: its own memory, never pooled
    # A host slot (layouts.is_host): md is flat u8 bytes; numpy sees (shape, dtype).
    host: tuple[tuple[int, ...], np.dtype] | None = None
    # A padded source (lower_compute.padded_depthwise): its own buffer, every byte set to
    # ``fill`` once when an execution context is made and never pooled, so the border no
    # kernel writes keeps that value from run to run; kernels write its interior through views.
    fill: int | None = None


@dataclass
class KernelInfo:
    """What `inspect` shows about a kernel (filled by the lowering)."""

    node: str | None = None
    op: str | None = None
    absorbed: list[str] = field(default_factory=list)
    optimizations: list[str] = field(default_factory=list)
    post_ops: list[str] = field(default_factory=list)
    post_op_details: list[str] = field(default_factory=list)
    role: str = "op"  # "op", "reorder" (inserted layout change), "io" (graph input/output)
    note: str = ""
    # How the kernel's integer store rounds (docs/numerics.md, "Rounding forms"), "" if it
    # writes no quantized value.
    rounding: str = ""

    def add_note(self, text: str) -> None:
        """Append ``text`` to the note ("; " between notes)."""
        self.note = f"{self.note}; {text}" if self.note else text


@dataclass(frozen=True)
class Kernel:
    name: str
    # oneDNN primitive kind ("convolution", "reorder", ...), or "numpy", "island" or
    # "onnxruntime" (a single op onnxruntime computes, as lower_resize's linear Resize)
    kind: str
    reads: list[str]
    writes: list[str]
    primitive: Primitive | None = None
    args: dict[int, str] = field(default_factory=dict)  # arg -> slot name
    fixed: dict[int, Memory] = field(default_factory=dict)  # arg -> constant memory
    numpy_fn: NumpyFn | None = None
    # numpy_fn(inputs, outputs) fills the output views itself instead of returning arrays
    numpy_into: bool = False
    info: KernelInfo = field(default_factory=KernelInfo)
    # threads its primitive was made for and runs with, when fewer than the plan's (a small
    # recurrent layer whose steps are too small to share: lower_rnn.py); None: the plan's
    team: int | None = None

    @property
    def impl(self) -> str:
        if self.primitive is not None:
            return self.primitive.impl_name
        return "onnxruntime" if self.kind == "onnxruntime" else "numpy"


@dataclass(frozen=True)
class BufferPlan:
    root_of: dict[str, str]  # slot -> root slot
    buffer_of: dict[str, int]  # root slot -> buffer index
    sizes: list[int]  # bytes per buffer
    lifetimes: dict[str, tuple[int, int]]  # root slot -> (first, last) kernel index
    fills: dict[int, int] = field(default_factory=dict)  # buffer index -> its initial byte


class DynamicOutput:
    """A graph output of run-time shape, set by the island kernel computing it, per thread
    (concurrent runs on one plan each see their own)."""

    def __init__(self) -> None:
        self._local = threading.local()

    def set(self, array: np.ndarray) -> None:
        self._local.value = np.array(array, copy=True)

    def take(self) -> np.ndarray:
        value = getattr(self._local, "value", None)
        if value is None:
            raise RuntimeError("dynamic output read before the kernel computing it ran")
        self._local.value = None
        return value


def moves_bytes_only(kernel: Kernel) -> bool:
    """A primitive without scales, zero points, post-ops or constant arguments: it moves its
    source's elements unchanged (a reorder copies them; a nearest resampling picks them)."""
    attr = kernel.primitive.pd.attr if kernel.primitive is not None else None
    return (attr is not None and not attr.scales_masks and not attr.zero_points_masks
            and not attr.post_ops and not kernel.fixed)


def root_slot(slots: dict[str, Slot], name: str) -> tuple[str, int]:
    """The slot owning ``name``'s bytes (followed through aliases) and ``name``'s byte offset
    in it."""
    offset = 0
    while (alias := slots[name].alias) is not None:
        offset += slots[name].offset
        name = alias
    return name, offset


def alias_group(slots: dict[str, Slot], name: str) -> list[str]:
    """Every non-constant slot sharing ``name``'s root (its alias group, ``name`` included)."""
    root = root_slot(slots, name)[0]
    return [other for other, slot in slots.items()
            if slot.const is None and root_slot(slots, other)[0] == root]


def plan_buffers(slots: dict[str, Slot], kernels: list[Kernel], inputs: list[str],
                 outputs: list[str]) -> BufferPlan:
    """Assign every non-constant slot's alias group a reusable buffer (module docstring)."""
    root_of: dict[str, str] = {}
    need: dict[str, int] = {}
    for name, slot in slots.items():
        if slot.const is not None:
            continue
        root, offset = root_slot(slots, name)
        root_of[name] = root
        need[root] = max(need.get(root, 0), offset + slot.md.size)
    end = len(kernels)
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for name in inputs:
        first[root_of[name]] = -1
    for index, kernel in enumerate(kernels):
        for name in kernel.writes:
            if name in root_of:
                first.setdefault(root_of[name], index)
        for name in kernel.reads + kernel.writes:
            if name in root_of:
                last[root_of[name]] = index
    for name in outputs:
        if name in root_of:
            last[root_of[name]] = end
    unwritten = sorted(r for r in need if r not in first)
    if unwritten:
        raise RuntimeError(f"plan reads slots that no kernel writes: {unwritten}")
    sizes: list[int] = []
    buffer_of: dict[str, int] = {}
    fills: dict[int, int] = {}
    for root in sorted(need):  # padded sources: a buffer of their own for the whole run
        fill = slots[root].fill
        if fill is not None:
            buffer_of[root] = len(sizes)
            fills[len(sizes)] = fill
            sizes.append(need[root])
            first[root], last[root] = -1, end
    starts: dict[int, list[str]] = {}
    ends: dict[int, list[str]] = {}
    for root, start in first.items():
        if root in buffer_of:
            continue
        starts.setdefault(start, []).append(root)
        ends.setdefault(max(last.get(root, start), start), []).append(root)
    free: list[int] = []
    for index in range(-1, end + 1):
        for root in sorted(starts.get(index, ())):
            buffer_of[root] = _take(free, sizes, need[root])
        for root in ends.get(index, ()):
            free.append(buffer_of[root])
    lifetimes = {r: (first[r], max(last.get(r, first[r]), first[r])) for r in first}
    return BufferPlan(root_of, buffer_of, sizes, lifetimes, fills)


def _take(free: list[int], sizes: list[int], nbytes: int) -> int:
    fitting = [b for b in free if sizes[b] >= nbytes]
    if fitting:
        chosen = min(fitting, key=lambda b: sizes[b])
    elif free:
        chosen = max(free, key=lambda b: sizes[b])
        sizes[chosen] = nbytes
    else:
        sizes.append(nbytes)
        return len(sizes) - 1
    free.remove(chosen)
    return chosen



@dataclass(frozen=True)
class Plan:
    """Kernels in execution order over slots; ``inputs``/``outputs`` map graph names to slots.

    ``buffers`` and ``scratchpad_bytes`` are computed from the kernels when the Plan is made."""

    name: str
    slots: dict[str, Slot]
    kernels: list[Kernel]
    inputs: dict[str, str]  # graph input -> plain slot
    outputs: dict[str, str]  # graph output -> plain slot (or a constant slot)
    reorders: int = 0  # layout reorders inserted between kernels
    io_reorders: int = 0  # graph input / output layout conversions
    notes: dict[str, Any] = field(default_factory=dict)
    homes: dict[str, str] = field(default_factory=dict)  # graph value -> slot holding it
    # graph outputs whose shape is known only at run time: an island kernel hands them over
    dynamic: dict[str, DynamicOutput] = field(default_factory=dict)
    buffers: BufferPlan = field(init=False)
    scratchpad_bytes: int = field(init=False)

    def __post_init__(self) -> None:
        buffers = plan_buffers(self.slots, self.kernels, list(self.inputs.values()),
                               list(self.outputs.values()))
        scratch = 0
        for kernel in self.kernels:
            if kernel.primitive is not None:
                md = kernel.primitive.pd.expected_args.get(int(Arg.SCRATCHPAD))
                scratch = max(scratch, md.md.size if md else 0)
        object.__setattr__(self, "buffers", buffers)
        object.__setattr__(self, "scratchpad_bytes", scratch)
        log.info("plan %s: %d kernels, %d slots, %d buffers (%d bytes), scratchpad %d bytes",
                 self.name, len(self.kernels), len(self.slots), len(buffers.sizes),
                 sum(buffers.sizes), scratch)

    def root(self, slot: str) -> tuple[str, int]:
        """The slot whose buffer ``slot`` shares, and ``slot``'s byte offset in it."""
        return root_slot(self.slots, slot)

    # ------------------------------------------------------------------- inspect
    def distinct_buffers(self) -> int:
        return len(self.buffers.sizes)

    def inspect(self) -> dict[str, Any]:
        """JSON-able description of every kernel (docs/design.md, `qfuse inspect --json`)."""
        kernels = [self._kernel_info(k) for k in self.kernels]
        pooled = [n for n, s in self.slots.items() if s.const is None]
        constants = {id(m): m for k in self.kernels for m in k.fixed.values()}
        constants.update({id(s.const): s.const for s in self.slots.values() if s.const})
        return {
            "kernels": kernels,
            "reorders": self.reorders,
            "io_reorders": self.io_reorders,
            "numpy_kernels": sum(k.impl == "numpy" for k in self.kernels),
            "buffers": {
                "count": self.distinct_buffers(),
                "bytes": sum(self.buffers.sizes),
                "slots": len(pooled),
            },
            "constants": {"count": len(constants),
                          "bytes": sum(m.md.size for m in constants.values())},
            **self.notes,
        }

    def _kernel_info(self, kernel: Kernel) -> dict[str, Any]:
        info = kernel.info
        data: dict[str, Any] = {
            "name": kernel.name,
            "primitive": kernel.kind,
            "impl": kernel.impl,
            "node": info.node,
            "op": info.op,
            "role": info.role,
            "src_dtype": self._dtype(kernel.reads[0]) if kernel.reads else None,
            "dst_dtype": self._dtype(kernel.writes[0]) if kernel.writes else None,
            "src_layouts": [self.slots[n].md.describe() for n in kernel.reads],
            "dst_layouts": [self.slots[n].md.describe() for n in kernel.writes],
            "post_ops": list(info.post_ops),
            "post_op_details": list(info.post_op_details),
            "optimizations": list(info.optimizations),
            "absorbed": list(info.absorbed),
        }
        if kernel.primitive is not None:
            attr = kernel.primitive.pd.attr
            weights = kernel.primitive.pd.weights_md
            data["weights_layout"] = weights.describe() if weights is not None else None
            data["scales_masks"] = {_arg(a): m for a, m in attr.scales_masks}
            data["zero_points_masks"] = {_arg(a): m for a, m in attr.zero_points_masks}
        if info.note:
            data["note"] = info.note
        if info.rounding:
            data["rounding"] = info.rounding
        return data

    def _dtype(self, slot: str) -> str:
        host = self.slots[slot].host
        return host[1].name if host is not None else self.slots[slot].md.dtype.name


def _arg(arg: int) -> str:
    from qfuse.runtime.onednn import arg_name

    return arg_name(arg)
