"""The lowering context: slots per graph value, reorder insertion, kernel creation.

Layout policy. Each value has a *home* slot: the layout its producer wrote it in. A consumer
asks ``source(value, md)`` for the layout it was created with; when that differs from the home
(or from an earlier converted copy, which is reused), a reorder kernel is inserted and counted —
in ``io_reorders`` when the value is a graph input, in ``reorders`` otherwise. Primitives are
first created with the producer's layout (``try_layouts``); only when that is unimplemented or
lands on a slow implementation (``ref:``, or an im2col ``gemm`` convolution) is the next
candidate (usually ``any``) taken and a reorder inserted.

Graph inputs are plain row-major slots the executor writes; graph outputs are reordered to plain
row-major slots at the end if their home is not.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from qfuse.compiler.errors import UnsupportedModelError
from qfuse.compiler.lower.layouts import (
    RESHAPES,
    QUANTIZERS,
    channels_last,
    const_memory,
    dense_in_order,
    dnnl_type,
    gapless,
    host_md,
    is_host,
    is_row_major,
    is_slow,
    md_like,
    nocopy_strides,
    plain_md,
    strided,
)
from qfuse.compiler.lower.in_place_concat import place_concats
from qfuse.compiler.lower.merge_copies import merge_copies
from qfuse.compiler.lower.sum_in_place import sum_in_place
from qfuse.compiler.lower.plan import DynamicOutput, Kernel, KernelInfo, NumpyFn, Plan, Slot
from qfuse.compiler.lower.reorder_check import two_step_middle
from qfuse.ir import DType, Graph, Node, Op, TensorInfo
from qfuse.ir.mode import Mode
from qfuse.runtime.onednn import (
    Arg,
    DataType,
    DnnlError,
    Memory,
    MemoryDesc,
    PrimitiveAttr,
    PrimitiveDesc,
    filled,
    reorder,
)
from qfuse.runtime.onednn.threads import team

log = logging.getLogger(__name__)

@dataclass
class Options:
    mode: Mode = Mode.FUSED  # one of COMPILED_MODES
    # Without VNNI/AMX, split int8 weights so accumulators stay exact (no_vnni.py); False
    # keeps oneDNN's int16-saturating kernels (for measuring what the split fixes).
    exact_int8: bool = True
    threads: int | None = None  # island sessions' thread count (None: one)
    # Quantizations the model writes the ONNX way round like ONNX (lower_quant.py); False:
    # oneDNN's reorder, rint(x·(1/s) + zp) — the composer option zero_point_before_round.
    onnx_rounding: bool = True
    # Concat inputs written straight into the output where the layout allows
    # (in_place_concat.py); False keeps every concat kernel (the composer option of that name).
    in_place_concat: bool = True
    # A reorder reading what a plain copy wrote reads the copy's source (merge_copies.py); False
    # keeps both (the composer option of that name).
    merge_copies: bool = True
    # A residual copied for a sum post-op is summed in place when its other readers can run
    # before the summing kernel (sum_in_place.py); False keeps the copy (the composer option
    # of that name).
    sum_in_place: bool = True
    # On an AMD CPU, a spatial int8 convolution with fewer than 32 output channels runs on
    # oneDNN's jit_int8 rather than brgconv (lower_compute.prefer_direct_int8); False keeps
    # oneDNN's first choice (the composer option direct_int8).
    direct_int8: bool = True
    # A linear Resize no quantization follows runs on oneDNN's resampling_linear where its taps
    # are ONNX's (lower_resize.py; within a few float32 ulps, not bit-exact); False keeps the
    # bit-exact numpy kernel (the composer option linear_resampling).
    linear_resampling: bool = True
    # An s8 or zero-point depthwise convolution that jit_int8 runs slowly runs on brdgmm over
    # its source padded explicitly (padded_depthwise.py); False keeps jit_int8 (the composer
    # option padded_depthwise).
    padded_depthwise: bool = True
    # An int8 convolution of few input channels and a long overlapping kernel (an STFT) runs
    # as a 1x1 convolution over a copy of its windows (conv_windows.py); False keeps it
    # direct (the composer option conv_windows).
    conv_windows: bool = True
    # A strided int8 convolution of fewer than 4 input channels runs over its source seen with
    # the stride folded into the channels, stride 1 (fold_stride.py); False keeps it as given
    # (the composer option fold_stride).
    fold_stride: bool = True


class LowerContext:
    """Builds a Plan for one graph; the table's functions call it (compiler/lower/table.py)."""

    def __init__(self, graph: Graph, options: Options | None = None) -> None:
        self.graph = graph
        self.options = options or Options()
        self.slots: dict[str, Slot] = {}
        self.kernels: list[Kernel] = []
        self.home: dict[str, str] = {}  # value -> slot its producer wrote
        self.copies: dict[str, list[str]] = {}  # value -> converted copies (other layouts)
        self.lowered: set[str] = set()
        self.deferred: dict[str, Any] = {}  # value -> what a skipped producer left for readers
        self.folded: dict[str, np.ndarray] = {}  # values computed at compile time
        # op -> layout probe: (ctx, consumer node, port, dtype) -> preferred src descriptor
        self.probes: dict[Any, Callable[..., MemoryDesc | None]] = {}
        self.probe_cache: dict[Any, MemoryDesc | None] = {}
        self.reorders = 0
        self.in_place_sums = 0
        self.exact_int8: dict[str, str] = {}  # kernel -> how it stays exact without VNNI
        self.io_reorders = 0
        self.current: Node | None = None
        self._names: dict[str, int] = {}
        self.dynamic: dict[str, DynamicOutput] = {}  # graph outputs of run-time shape
        for name in graph.inputs:
            self.slots[name] = self._plain_slot(name, graph.info(name))
            self.home[name] = name

    @staticmethod
    def _plain_slot(name: str, info: TensorInfo) -> Slot:
        """A row-major slot for ``info``, or a host slot (layouts.is_host)."""
        if is_host(info):
            return Slot(name, host_md(info.shape, info.dtype.np),
                        host=(tuple(info.shape), info.dtype.np))
        return Slot(name, plain_md(info.shape, dnnl_type(info.dtype)))

    def define_plain(self, value: str) -> str:
        """The home slot of a value a numpy or island kernel writes (row-major or host)."""
        name = self.fresh(value)
        self.slots[name] = self._plain_slot(name, self.info(value))
        self.home[value] = name
        return name

    # ------------------------------------------------------------------ values
    def info(self, value: str) -> TensorInfo:
        return self.graph.info(value)

    def const(self, value: str) -> np.ndarray | None:
        data = self.graph.constant(value)
        return self.folded.get(value) if data is None else data

    def need_const(self, node: Node, port: int, what: str) -> np.ndarray:
        data = self.const(node.inputs[port]) if port < len(node.inputs) else None
        if data is None:
            raise UnsupportedModelError(f"node {node}: {what} (input {port}) must be a constant")
        return data

    def md_of(self, value: str) -> MemoryDesc:
        return self.slots[self.home_slot(value)].md

    def home_slot(self, value: str) -> str:
        if value not in self.home:
            data = self.const(value)
            if data is None:
                raise RuntimeError(f"value '{value}' has no slot yet (lowering order broken)")
            array = np.asarray(data)
            info = self.graph.values[value].info if value in self.graph.values else None
            if info is None or is_host(info):
                raw = np.frombuffer(np.ascontiguousarray(array).tobytes() or b"\0", np.uint8)
                memory = const_memory(raw)
                name = self.fresh(f"const:{value}")
                self.slots[name] = Slot(name, memory.md, const=memory,
                                        host=(tuple(array.shape), array.dtype))
            else:
                name = self.const_slot(f"const:{value}", const_memory(array))
            self.home[value] = name
        return self.home[value]

    def const_slot(self, base: str, memory: Memory) -> str:
        """A slot over a constant's own memory (never pooled); returns its name."""
        name = self.fresh(base)
        self.slots[name] = Slot(name, memory.md, const=memory)
        return name

    def fresh(self, base: str) -> str:
        count = self._names.get(base, 0)
        self._names[base] = count + 1
        name = base if count == 0 and base not in self.slots else f"{base}#{count}"
        return name if name not in self.slots else self.fresh(base)

    def define(self, value: str, md: MemoryDesc, *, alias: str | None = None,
               offset: int = 0) -> str:
        """The home slot of a value a kernel is about to write."""
        name = self.fresh(value)
        self.slots[name] = Slot(name, md, alias, offset)
        self.home[value] = name
        return name

    def temp(self, base: str, md: MemoryDesc, *, alias: str | None = None,
             offset: int = 0, fill: int | None = None) -> str:
        """A slot for an intermediate; ``fill``: a buffer of its own starting at that byte
        (Slot.fill)."""
        name = self.fresh(base)
        self.slots[name] = Slot(name, md, alias, offset, fill=fill)
        return name

    def checkpoint(self) -> Callable[[], None]:
        """A function that puts the kernels, slots, homes, copies, counts, exactness records
        and deferred dequantizes back as they are now: for a lowering that gives up part way
        and tries another way (lowering happens node by node, so nothing else refers to what
        it added)."""
        kernels, slots = len(self.kernels), dict(self.slots)
        home, copies = dict(self.home), {k: list(v) for k, v in self.copies.items()}
        counts = (self.reorders, self.io_reorders, self.in_place_sums)
        exact, deferred = dict(self.exact_int8), dict(self.deferred)

        def restore() -> None:
            del self.kernels[kernels:]
            self.slots, self.home = dict(slots), dict(home)
            self.copies = {k: list(v) for k, v in copies.items()}
            self.reorders, self.io_reorders, self.in_place_sums = counts
            self.exact_int8, self.deferred = dict(exact), dict(deferred)

        return restore

    def is_output(self, value: str) -> bool:
        return value in self.graph.outputs

    def later_readers(self, value: str, node: Node) -> bool:
        """True if ``value`` is read after ``node`` (by an unlowered node or as an output)."""
        if self.is_output(value) or value in self.graph.inputs:
            return True
        return any(c.name != node.name and c.name not in self.lowered
                   for c, _ in self.graph.consumers(value))

    def group(self, slot: str) -> list[str]:
        """Values whose slots share ``slot``'s buffer root."""
        root = self._root(slot)
        return [v for v, s in self.home.items() if self._root(s) == root] + [
            v for v, copies in self.copies.items() for s in copies if self._root(s) == root]

    def _root(self, slot: str) -> str:
        while (alias := self.slots[slot].alias) is not None:
            slot = alias
        return slot

    def may_overwrite(self, slot: str, node: Node) -> bool:
        """True when no value living in ``slot``'s buffer is read after ``node``."""
        if self.slots[slot].const is not None:
            return False
        return not any(self.later_readers(v, node) for v in self.group(slot))

    # --------------------------------------------------------------- layouts
    def source(self, value: str, md: MemoryDesc | None = None) -> str:
        """A slot holding ``value`` with descriptor ``md`` (home if None); reorders if needed."""
        home = self.home_slot(value)
        if md is None or _identical(self.slots[home].md, md) or (
                self.slots[home].const is not None and self.slots[home].md == md):
            return home
        for copy in self.copies.get(value, []):
            if _identical(self.slots[copy].md, md):
                return copy
        if self.slots[home].md == md:
            # oneDNN calls two descriptors equal when they differ only in the strides of
            # size-1 dims, but its AVX-512 jit binary compares the strides themselves (a 1x1
            # image in acdb strides as src, abcd as dst: ref:any): a view with md's own
            name = self.temp(f"{value}@as", md, alias=home)
            self.copies.setdefault(value, []).append(name)
            return name
        if self.slots[home].const is not None:  # a constant is laid out once, now
            name = self.const_slot(f"const:{value}", filled(md, np.array(
                self.const(value), order="C", copy=True)))
        else:
            name = self.temp(f"{value}@reorder", md)
            role = "io" if value in self.graph.inputs else "reorder"
            self.add_reorder(home, name, role=role, note=f"layout of '{value}'")
        self.copies.setdefault(value, []).append(name)
        return name

    def strided_home(self, value: str) -> str:
        """``value``'s home slot when its layout has strides (views of it can re-stride its
        bytes), else a channels-last copy of it (a blocked layout)."""
        home = self.home_slot(value)
        md = self.slots[home].md
        if md.strides is not None and not md.inner_blocks:
            return home
        return self.source(value, channels_last(self.info(value).shape, md.dtype))

    def plain_source(self, value: str) -> str:
        home = self.home_slot(value)
        md = self.slots[home].md
        if is_row_major(md):
            return home
        return self.source(value, plain_md(md.dims, md.dtype))

    def view(self, value: str, dims: Sequence[int], base: str | None = None, *,
             row_major: bool = False) -> str:
        """A slot of ``dims`` aliasing ``value``'s bytes (zero copy): the same strided layout
        re-split when possible (a Reshape of a channels-last tensor stays channels-last),
        else — or when ``row_major`` — a row-major view, after a reorder if needed."""
        if math.prod(dims) != self.md_of(value).nelems:
            raise RuntimeError(f"view of '{value}' as {tuple(dims)} changes the element count")
        home = self.home_slot(value)
        md = self.slots[home].md
        if not row_major and md.is_plain and self.slots[home].const is None:
            strides = nocopy_strides(md.dims, md.strides or (), tuple(dims))
            if strides is not None:
                try:
                    view_md = MemoryDesc.from_strides(tuple(dims), md.dtype, strides)
                except DnnlError:
                    view_md = None
                if view_md is not None and view_md.size <= md.size:
                    return self.temp(base or f"{value}@view", view_md, alias=home)
        source = self.plain_source(value)
        plain = plain_md(dims, self.slots[source].md.dtype)
        return self.temp(base or f"{value}@view", plain, alias=source)

    def ranked(self, value: str, rank: int) -> str:
        """``value`` seen at ``rank``: itself, or — of lower rank, aligned on the trailing dims
        as ONNX broadcasts — a zero-copy view with leading 1s, one per value (a rank-0 value
        lives in a host slot: the view reads its bytes as one f32)."""
        info = self.info(value)
        if len(info.shape) >= rank:
            return value
        name = f"{value}@rank{rank}"
        if name not in self.home:
            dims = (1,) * (rank - len(info.shape)) + tuple(info.shape)
            home = self.home_slot(value)
            if self.slots[home].host is not None:
                assert info.dtype is DType.F32 and math.prod(dims) == 1
                self.home[name] = self.temp(name, plain_md(dims, DataType.f32), alias=home)
            else:
                self.home[name] = self.view(value, dims)
        return name

    def preferred(self, value: str, dtype: DataType, depth: int = 0) -> MemoryDesc | None:
        """The layout ``value``'s readers would pick, if one says: a convolution's own choice,
        channels-last for int8 pooling, followed through Reshape-like views and Split."""
        if depth > 4:
            return None
        dims = self.info(value).shape
        if self.is_output(value):  # the user reads it row-major
            return plain_md(dims, dtype)
        for consumer, port in self.graph.consumers(value):
            probe = self.probes.get(consumer.op)
            found = probe(self, consumer, port, dtype) if probe is not None else None
            if found is None and consumer.op in RESHAPES:
                below = self.preferred(consumer.outputs[0], dtype, depth + 1)
                if below is not None and below.is_plain:
                    strides = nocopy_strides(below.dims, below.strides or (), dims)
                    found = strided(dims, dtype, strides)
            elif found is None and (consumer.op in QUANTIZERS or (
                    consumer.op is Op.DYNAMIC_QUANTIZE_LINEAR and port == 0)):  # layout kept
                below = self.preferred(consumer.outputs[0], dtype, depth + 1)
                if below is not None and below.is_plain:
                    found = below
            elif found is None and consumer.op in (Op.SPLIT, Op.SLICE):
                for out in consumer.outputs:
                    below = self.preferred(out, dtype, depth + 1)
                    if below is not None and below.is_plain:
                        found = dense_in_order(below, dims)
                        break
            if found is not None:
                return md_like(found, dtype)
        return None

    def try_layouts(self, kind: str, make: Callable[[Any], PrimitiveDesc],
                    candidates: Sequence[Any]) -> PrimitiveDesc:
        """The first candidate whose primitive is implemented and not slow (else the first
        implemented one); ``make(candidate)`` builds the descriptor."""
        fallback: PrimitiveDesc | None = None
        errors = []
        for candidate in candidates:
            try:
                pd = make(candidate)
            except DnnlError as exc:
                errors.append(str(exc))
                continue
            if not is_slow(pd.impl_name, kind):
                return pd
            fallback = fallback or pd
        if fallback is not None:
            log.info("node %s: %s runs on %s", self.current, kind, fallback.impl_name)
            return fallback
        raise UnsupportedModelError(f"node {self.current}: oneDNN has no {kind} for it: "
                                    + " | ".join(errors))

    # --------------------------------------------------------------- kernels
    def info_for(self, node: Node | None, **extra: Any) -> KernelInfo:
        if node is None:
            return KernelInfo(**extra)
        absorbed = list(node.origin)
        if node.fused is not None:
            absorbed += [a for a in node.fused.absorbed if a not in absorbed]
        return KernelInfo(node=node.name, op=node.op.value, absorbed=absorbed, **extra)

    def add_primitive(self, name: str, pd: PrimitiveDesc, args: dict[int, str],
                      fixed: dict[int, Memory] | None = None, *, info: KernelInfo,
                      reads: Sequence[str] | None = None,
                      writes: Sequence[str] | None = None,
                      threads: int | None = None) -> Kernel:
        """A kernel; ``reads`` defaults to every slot argument except DST, ``writes`` to
        DST (a training-mode normalization also writes its MEAN / VARIANCE); ``threads``:
        fewer threads than the plan's that ``pd`` was made for, with which its primitive is
        made and runs (``Kernel.team``)."""
        with team(threads):
            primitive = pd.create()
        if writes is None:
            writes = [args[int(Arg.DST)]] if int(Arg.DST) in args else []
        if reads is None:
            reads = [s for a, s in args.items() if a != int(Arg.DST)]
        kernel = Kernel(self.fresh_kernel(name), pd.kind.name, list(reads), list(writes),
                        primitive, dict(args), dict(fixed or {}), info=info, team=threads)
        if kernel.kind in ("convolution", "deconvolution", "matmul") and \
                kernel.impl.startswith("ref"):
            log.warning("kernel %s runs on the slow %s", kernel.name, kernel.impl)
        self.kernels.append(kernel)
        return kernel

    def fresh_kernel(self, base: str) -> str:
        taken = {k.name for k in self.kernels}
        name, i = base, 1
        while name in taken:
            name, i = f"{base}#{i}", i + 1
        return name

    def add_reorder(self, src: str, dst: str, *, attr: PrimitiveAttr | None = None,
                    fixed: dict[int, Memory] | None = None, role: str = "reorder",
                    node: Node | None = None, note: str = "") -> Kernel:
        src_md, dst_md = self.slots[src].md, self.slots[dst].md
        middle_md = two_step_middle(src_md, dst_md, attr, fixed or {})
        if middle_md is not None:
            # oneDNN 3.2 drops the zero point of this layout change (reorder_check.py): the
            # scales and zero points in the source's layout, then a plain copy
            middle = self.temp(f"{dst}@zero_point", middle_md)
            first = self.add_reorder(src, middle, attr=attr, fixed=fixed, role=role,
                                     node=node, note=note)
            self.add_reorder(middle, dst, note="a layout change without the zero point, "
                             "which oneDNN 3.2's reorder drops here (reorder_check.py)")
            return first
        main = flat_split(src_md, dst_md, attr)
        if main is not None:  # oneDNN 3.2's jit reorder is slow on such counts (FLAT_BLOCKS)
            n = src_md.nelems
            parts = [(0, main), (main, n - main)]
            split = (f"{n} elements as {main} and {n - main}: oneDNN 3.2's jit reorder is slow "
                     f"on a count with no divisor in {FLAT_BLOCKS} that is a multiple of 4")
            made = [self.add_reorder(
                self.temp(f"{src}@part", plain_md((count,), src_md.dtype), alias=src,
                          offset=start * src_md.numpy_dtype.itemsize),
                self.temp(f"{dst}@part", plain_md((count,), dst_md.dtype), alias=dst,
                          offset=start * dst_md.numpy_dtype.itemsize),
                attr=attr, fixed=fixed, role=role, node=node,
                note=f"{note}; {split}" if note else split)
                for start, count in parts]
            # one KernelInfo for both parts: what the caller adds to the returned kernel's
            # (absorbed nodes, rounding) holds for the rest too
            rest = self.kernels.index(made[1])
            self.kernels[rest] = replace(made[1], info=made[0].info)
            return made[0]
        pd = reorder(src_md, dst_md, attr=attr)
        if role == "reorder":
            self.reorders += 1
        elif role == "io":
            self.io_reorders += 1
        base = node.name if node is not None and role == "op" else f"reorder:{dst}"
        info = self.info_for(node, role=role, note=note) if node is not None else KernelInfo(
            role=role, note=note)
        return self.add_primitive(base, pd, {int(Arg.SRC): src, int(Arg.DST): dst}, fixed,
                                  info=info)

    def add_numpy(self, name: str, fn: NumpyFn, reads: Sequence[str], writes: Sequence[str],
                  info: KernelInfo, kind: str = "numpy", into: bool = False) -> Kernel:
        """A kernel numpy runs; ``into``: fn(inputs, outputs) writes the output views."""
        for slot in (*reads, *writes):
            if not is_row_major(self.slots[slot].md):
                raise RuntimeError(f"numpy kernel {name} needs plain slots, '{slot}' is "
                                   f"{self.slots[slot].md.describe()}")
        kernel = Kernel(self.fresh_kernel(name), kind, list(reads), list(writes),
                        numpy_fn=fn, numpy_into=into, info=info)
        self.kernels.append(kernel)
        return kernel

    def weights(self, array: np.ndarray, md: MemoryDesc) -> Memory:
        """Constant weights reordered once into the primitive's descriptor (never memcpy)."""
        return filled(md, np.array(array, order="C", copy=True))

    # ------------------------------------------------------------------ finish
    def finish(self) -> Plan:
        outputs: dict[str, str] = {}
        for value in self.graph.outputs:
            if value in self.dynamic:
                continue
            home = self.home_slot(value)
            md = self.slots[home].md
            if is_row_major(md) or self.slots[home].const is not None:
                outputs[value] = home
                continue
            name = self.temp(f"{value}@output", plain_md(md.dims, md.dtype))
            self.add_reorder(home, name, role="io", note=f"graph output '{value}'")
            outputs[value] = name
        inputs = {name: self.home_slot(name) for name in self.graph.inputs}
        self.slots, self.kernels, placed = place_concats(
            self.graph, self.slots, self.kernels, {*inputs.values(), *outputs.values()},
            enabled=self.options.in_place_concat and self.options.mode is not Mode.UNFUSED)
        concats = [dataclasses.asdict(p) for p in placed]
        merged = 0
        if self.options.merge_copies and self.options.mode is not Mode.UNFUSED:
            self.slots, self.kernels, merged = merge_copies(
                self.slots, self.kernels, {*inputs.values(), *outputs.values()})
        summed = 0
        if self.options.sum_in_place and self.options.mode is not Mode.UNFUSED:
            self.slots, self.kernels, summed = sum_in_place(
                self.slots, self.kernels, {*inputs.values(), *outputs.values()})
        plan = Plan(self.graph.name, self.slots, self.kernels, inputs, outputs,
                    self.reorders, self.io_reorders,
                    notes={"in_place_sums": self.in_place_sums + summed,
                           "in_place_concats": sum(c["removed"] for c in concats),
                           "concats": concats, "merged_copies": merged},
                    homes={v: s for v, s in self.home.items() if v in self.graph.values},
                    dynamic=dict(self.dynamic))
        return plan


def _identical(a: MemoryDesc, b: MemoryDesc) -> bool:
    """Equal for oneDNN and with the same strides (``MemoryDesc ==`` ignores the strides of
    size-1 dims)."""
    return a == b and a.strides == b.strides


# A flat (elementwise) reorder from FLAT_MIN elements whose count has a prime factor above
# FLAT_PRIME and no divisor in FLAT_BLOCKS that is a multiple of 4 runs as two: the largest
# multiple of FLAT_PART, then the rest. oneDNN 3.2's jit:uni reorder falls to a slow path on
# such counts (u8 → f32 with a scale, 2 threads, a 2-core AMD EPYC: 24929 = 97·257 elements
# 41 µs, as 24832 + 97 3.5 + 1.7; 150628 = 4·37657 elements 4.2 ms, 18 + 1.7 µs; 1000001 =
# 101·9901 elements 8.0 ms, 104 + 1.7 µs; 100002 = 2·3·7·2381 elements 155 µs, 13 + 1.7).
# Other counts run whole, where splitting would only add a kernel (18620 = 4·4655 elements
# 3.5 µs whole, 3.4 + 1.7 split; 21294 = 2·3²·7·13² 4.8 µs whole; 74793 = 3·107·233 5.9 µs
# whole, 10.3 + 1.7 split; 265000 elements 12 µs whole, 29 as 264960 + 40). oneDNN issue
# #896 reports count-dependent reorder times too.
FLAT_BLOCKS = (64, 1024)
FLAT_PRIME = 256
FLAT_PART = 256
FLAT_MIN = 16384


def _smooth(n: int, bound: int) -> bool:
    """Has ``n`` no prime factor above ``bound``?"""
    for p in range(2, bound + 1):
        while n % p == 0:
            n //= p
    return n == 1


def flat_split(src: MemoryDesc, dst: MemoryDesc, attr: PrimitiveAttr | None) -> int | None:
    """The count to copy first when the reorder from ``src`` to ``dst`` is element for element
    over their bytes (both gapless, with the same strides), with at most one scale and zero
    point each and no post-ops, and its count is at least FLAT_MIN, with a prime factor
    above FLAT_PRIME and no divisor in FLAT_BLOCKS that is a multiple of 4; else None."""
    n = src.nelems
    if (n < FLAT_MIN or any(n % d == 0 for d in range(FLAT_BLOCKS[0], FLAT_BLOCKS[1] + 1, 4))
            or _smooth(n, FLAT_PRIME)):
        return None
    if (not src.is_plain or not dst.is_plain or src.strides != dst.strides
            or not gapless(src) or not gapless(dst)):
        return None
    if attr is not None and (any(attr.scales_masks.values())
                             or any(attr.zero_points_masks.values()) or attr.post_ops):
        return None
    return n // FLAT_PART * FLAT_PART
