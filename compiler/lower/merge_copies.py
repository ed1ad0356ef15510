"""Two reorders in a row become one: a copy's reader reads the copy's source through a view.

A reorder R1 without attributes copies a value A into a slot D (a layout change, a Transpose
written into its output's buffer, a Split part); when the only kernel reading those bytes is
another reorder R2 (a u8 → s8 shift for a MatMul's weights, a dequantize, a layout change for
the next kernel), R2 can read A itself: R1 moved every element unchanged, so the value R2
reads at index ``i`` of its source slot S sits in A at the index R1 took it from. When S and D
cover the same bytes and every dim of S that is not 1 has a dim of D of the same size and
stride (a permutation of D's dims, as a Transpose written into its output's row-major buffer
gives), or runs through consecutive dims of D that A lays out as one run too (a Reshape of a
channels-last Split part to ``[1, C, H·W]``), S becomes a view of A with A's strides of the
matching dims (or, where S splits one dim of D into parts, that dim's stride times each
part's step); R2 is recreated on it with its own scales and zero points, and R1 goes. Exact:
no arithmetic moves, R2 computes the same thing from the same numbers.

Where it matters: attention heads whose probabilities are a MatMul's weights (EfficientViT-M,
LeViT): a Transpose of the Softmax output, then the u8 → s8 shift oneDNN's int8 matmul needs
for its weights — two kernels per head, one after this; EfficientViT-M's keys, a Split part of
the channels-last qkv convolution seen as ``[1, C, H·W]``, then the same shift (QDQ 452 → 428
kernels); YOLOv8's box distributions, a Split part of the head's Concat seen as
``[1, 4, 16, N]`` (a dim of D split into parts that tile it), then the Transpose before the
Softmax over the bins (one 537 KB copy fewer). Preconditions (each checked): R1 has no
scales, zero points or post-ops and keeps the data type; R2 has no post-ops; nothing else reads
or writes the bytes of S, and they are no graph input or output (``ends``); S and D are plain;
R2 on the view keeps its zero points (oneDNN 3.2 drops them on some layout changes:
reorder_check.py). Runs on the lowered plan, after in-place concats and before buffers are planned.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np

from qfuse.compiler.lower.plan import Kernel, Slot, alias_group, moves_bytes_only, root_slot
from qfuse.compiler.lower.reorder_check import run_once, two_step_middle
from qfuse.runtime.onednn import Arg, Memory, MemoryDesc, PrimitiveAttr, reorder

log = logging.getLogger(__name__)


def merge_copies(slots: dict[str, Slot], kernels: list[Kernel], ends: set[str]
                 ) -> tuple[dict[str, Slot], list[Kernel], int]:
    """The plan with each mergeable pair of reorders as one (module docstring); returns the
    new slots and kernels and how many copies went."""
    slots, kernels = dict(slots), list(kernels)
    merged = 0
    index = 0
    while index < len(kernels):
        found = _mergeable(slots, kernels, index, ends)
        if found is None:
            index += 1
            continue
        first, views = found
        reader = kernels[index]
        source = reader.args[int(Arg.SRC)]
        copy = kernels[first]
        view = views[source]
        attr = _attr(reader)
        if two_step_middle(view, slots[reader.args[int(Arg.DST)]].md, attr,
                           reader.fixed) is not None:
            index += 1  # oneDNN 3.2 would drop its zero point on this layout change
            continue
        origin, written = copy.args[int(Arg.SRC)], copy.args[int(Arg.DST)]
        if written not in views:  # the home of the copied value (run_all reads it): over A
            d = slots[written].md
            views = {**views, written: _through(d, d, slots[origin].md)}
        for name, member in views.items():  # S and the other views of its bytes: over A
            slots[name] = Slot(name, member, alias=origin)
        pd = reorder(view, slots[reader.args[int(Arg.DST)]].md, attr=attr)
        note = f"reads '{copy.info.node or copy.name}''s source, not its copy"
        kernels[index] = dataclasses.replace(
            reader, primitive=pd.create(), info=dataclasses.replace(
                reader.info, note=f"{reader.info.note}; {note}".lstrip("; ")))
        del kernels[first]
        merged += 1
        log.info("reorder %s reads %s's source: one copy less", reader.name, copy.name)
    return slots, kernels, merged


def _mergeable(slots: dict[str, Slot], kernels: list[Kernel], index: int, ends: set[str]
               ) -> tuple[int, dict[str, MemoryDesc]] | None:
    """(the copy's index, {slot: its view of the copy's source} for the source S of
    ``kernels[index]`` and every other slot over S's bytes but the copy's dst) or None."""
    reader = kernels[index]
    if reader.kind != "reorder" or reader.primitive is None or \
            reader.primitive.pd.attr.post_ops:
        return None
    source = reader.args.get(int(Arg.SRC))
    if source is None or slots[source].const is not None or slots[source].host is not None:
        return None
    group = set(alias_group(slots, source))
    users = [k for k, kernel in enumerate(kernels) if group & {*kernel.reads, *kernel.writes}]
    if len(users) != 2 or users[1] != index or group & ends:
        return None
    copy = kernels[users[0]]
    if (copy.kind != "reorder" or not moves_bytes_only(copy) or len(copy.writes) != 1
            or reader.reads != [source]):
        return None
    origin, written = copy.args[int(Arg.SRC)], copy.args[int(Arg.DST)]
    a, d, s = slots[origin].md, slots[written].md, slots[source].md
    if (written not in group or slots[origin].host is not None or a.dtype != d.dtype
            or d.dtype != s.dtype or not (a.is_plain and d.is_plain)):
        return None
    # S, and any other slot over the same bytes (the home of a value S is a Reshape of, which
    # run_all reads), become views of A: each must cover D's bytes with D's dims permuted
    views: dict[str, MemoryDesc] = {}
    at = root_slot(slots, written)[1]
    for name in (group - {written}) | {source}:  # S may be the copy's dst itself
        md = slots[name].md
        view = _through(md, d, a) if (md.is_plain and md.dtype == d.dtype and md.size == d.size
                                      and root_slot(slots, name)[1] == at) else None
        if view is None:
            return None
        views[name] = view
    if not _agrees(copy, reader, slots, views[source]):
        return None
    return users[0], views


def _through(s: MemoryDesc, d: MemoryDesc, a: MemoryDesc) -> MemoryDesc | None:
    """The view of A (the copy's source, D's dims) with S's dims when S and D describe the
    same bytes with D's dims permuted, runs of them merged (a Reshape of a channels-last
    ``[1, C, H, W]`` to ``[1, C, H·W]``) or one of them split (``[1, 64, N]`` channels-last
    to ``[1, 4, 16, N]``: YOLOv8's box distributions): S dim k takes A's stride of the D dim
    of equal size and stride, or of the innermost of D dims that S's dim runs through in D's
    memory order, when A lays those out as one run too, or, for a part of a D dim, that dim's
    A stride times the part's step in it (the parts tiling the dim); None when the dims do not
    match so."""
    free = [m for m, size in enumerate(d.dims) if size > 1]
    d_strides, a_strides = d.strides or (), a.strides or ()
    strides: list[int] = []
    parts: dict[int, list[tuple[int, int]]] = {}  # D dim -> (step, size) of the S dims in it
    for size, stride in zip(s.dims, s.strides or (), strict=True):
        if size == 1:
            strides.append(0)
            continue
        run = _run_of(size, stride, free, d.dims, d_strides)
        if run is None:
            part = _part_of(size, stride, free, d.dims, d_strides)
            if part is None:
                return None
            m, step = part
            parts.setdefault(m, []).append((step, size))
            strides.append(a_strides[m] * step)
            continue
        if any(a_strides[outer] != a_strides[inner] * d.dims[inner]
               for inner, outer in zip(run, run[1:])):
            return None
        for m in run:
            free.remove(m)
        strides.append(a_strides[run[0]])
    for m, split in parts.items():  # the parts must tile the D dim: steps 1, n0, n0·n1, ...
        covered = 1
        for step, size in sorted(split):
            if step != covered:
                return None
            covered *= size
        if covered != d.dims[m] or m not in free:  # or a run of another S dim took it
            return None
        free.remove(m)
    return None if free else MemoryDesc.from_strides(s.dims, a.dtype, strides)


def _part_of(size: int, stride: int, free: list[int], dims: tuple[int, ...],
             strides: tuple[int, ...]) -> tuple[int, int] | None:
    """(the D dim, the step in it) when one dim of ``size`` and ``stride`` lies within one D
    dim, a split of it (a Reshape of a Split part's channels into heads and their width):
    ``stride`` is ``step`` times that dim's stride and ``size · step`` divides its extent;
    None otherwise."""
    for m in free:
        step, rest = divmod(stride, strides[m]) if strides[m] else (0, 0)
        if not rest and step and dims[m] % (size * step) == 0:
            return m, step
    return None


def _run_of(size: int, stride: int, free: list[int], dims: tuple[int, ...],
            strides: tuple[int, ...]) -> list[int] | None:
    """D dims (innermost first) that one dim of ``size`` and ``stride`` runs through: a dim of
    that stride, then one whose stride is its extent, and so on up to ``size`` elements; a dim
    of equal size and stride alone first."""
    exact = [m for m in free if dims[m] == size and strides[m] == stride]
    if exact:
        return exact[:1]
    run: list[int] = []
    covered, step = 1, stride
    while covered < size:
        nxt = [m for m in free if m not in run and strides[m] == step
               and size % (covered * dims[m]) == 0]
        if not nxt:
            return None
        run.append(nxt[0])
        covered *= dims[nxt[0]]
        step = strides[nxt[0]] * dims[nxt[0]]
    return run


def _agrees(copy: Kernel, reader: Kernel, slots: dict[str, Slot], view: MemoryDesc) -> bool:
    """Whether the merged reorder writes what the two did, on random bytes: oneDNN 3.2's jit
    reorder misapplies a zero point on some layout changes (docs/onednn.md: u8 → s8 with a
    source zero point from a (1, 6, 16, 49) view with strides (18816, 64, 1, 384) gives wrong
    values), so each merge is checked once at compile time."""
    a = slots[copy.args[int(Arg.SRC)]].md
    d, s = slots[copy.args[int(Arg.DST)]].md, slots[reader.args[int(Arg.SRC)]].md
    out_md = slots[reader.args[int(Arg.DST)]].md
    if view.size > a.size:
        return False
    source = np.random.default_rng(0).integers(0, 256, a.size, dtype=np.uint8)
    middle = np.zeros(s.size, np.uint8)
    want, got = np.zeros(out_md.size, np.uint8), np.zeros(out_md.size, np.uint8)
    run_once(reorder(a, d), {int(Arg.SRC): Memory(a, source), int(Arg.DST): Memory(d, middle)})
    run_once(reorder(s, out_md, attr=_attr(reader)),
             {int(Arg.SRC): Memory(s, middle), int(Arg.DST): Memory(out_md, want),
              **reader.fixed})
    run_once(reorder(view, out_md, attr=_attr(reader)),
             {int(Arg.SRC): Memory(view, source[:view.size]), int(Arg.DST): Memory(out_md, got),
              **reader.fixed})
    return bool(np.array_equal(want, got))


def _attr(kernel: Kernel) -> PrimitiveAttr:
    """A reorder's attribute rebuilt from its snapshot (scales and zero points only)."""
    assert kernel.primitive is not None
    info, attr = kernel.primitive.pd.attr, PrimitiveAttr()
    for arg, mask in info.scales_masks:
        attr.set_scales_mask(arg, mask)
    for arg, mask in info.zero_points_masks:
        attr.set_zero_points_mask(arg, mask)
    return attr
