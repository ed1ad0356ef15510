"""A residual copied for a sum post-op is summed in place once its other readers run first.

A kernel K whose sum post-op adds a residual B writes its output D over B's bytes when nothing
reads B after K (lower_compute.sum_dst); otherwise the lowering copies B into D first (a
reorder R) and K sums into the copy. Often the readers of B after K are plain copies that do
not need K's result: YOLOv8's C2f block concatenates the bottleneck's residual (a Split part)
with the bottleneck's output, and the Concat's copy of that input (in_place_concat.py) comes
after K only because the Concat node reads K's output too. Such a copy can run before K: it
reads B, which is complete, and writes a region nothing between touches. Then R goes and D
becomes a view of B's buffer — what sum_dst does when it may — so K adds the same residual
values and writes the same output. Exact: no kernel computes anything else, the copies only run
earlier.

Preconditions, each checked:
- R is a reorder without attributes copying B (all of its buffer) into a view of all of D's
  buffer, of the same layout, and the next kernel touching D's buffer is K, which writes D
  and has a sum post-op; K does not read B's buffer;
- neither buffer is a graph input, output or constant;
- every kernel after K touching B's buffer is a reorder without attributes that only reads
  it, and nothing from K up to that reorder reads or writes what the reorder writes (it moves
  to just before K, in its order); nothing after R writes B's buffer.

Runs on the lowered plan after in-place concats and merged copies, before buffers are planned.
"""

from __future__ import annotations

import dataclasses
import logging

from qfuse.compiler.lower.layouts import same_bytes
from qfuse.compiler.lower.plan import Kernel, Slot, alias_group, moves_bytes_only, root_slot
from qfuse.runtime.onednn import Arg, MemoryDesc

log = logging.getLogger(__name__)


def sum_in_place(slots: dict[str, Slot], kernels: list[Kernel], ends: set[str]
                 ) -> tuple[dict[str, Slot], list[Kernel], int]:
    """The plan with each residual copy for a sum post-op removed where its other readers can
    run before the summing kernel (module docstring); returns the new slots and kernels and
    how many copies went."""
    slots, kernels = dict(slots), list(kernels)
    removed = 0
    index = 0
    while index < len(kernels):
        found = _removable(slots, kernels, index, ends)
        if found is None:
            index += 1
            continue
        summing, moved = found
        copy = kernels[index]
        source, target = copy.args[int(Arg.SRC)], copy.args[int(Arg.DST)]
        home = root_slot(slots, target)[0]
        early = [kernels[k] for k in moved]
        rest = [k for i, k in enumerate(kernels) if i not in moved and i != index]
        at = rest.index(kernels[summing])
        kernels = rest[:at] + early + rest[at:]
        slots[home] = dataclasses.replace(slots[home], alias=root_slot(slots, source)[0],
                                          offset=0)
        summer = kernels[at + len(early)]
        summer.info.add_note(f"sums in place into the buffer of '{source}' (its readers "
                             f"after this kernel moved before it)")
        removed += 1
        log.info("%s sums in place into %s: copy %s removed, %d reader(s) moved before it",
                 summer.name, source, copy.name, len(early))
    return slots, kernels, removed


def _same_layout(a: MemoryDesc, b: MemoryDesc) -> bool:
    """The same bytes for elements of the same size, whatever their types (a u8 residual
    under an s8 output)."""
    return (a.is_plain and b.is_plain and a.numpy_dtype.itemsize == b.numpy_dtype.itemsize
            and same_bytes(MemoryDesc.from_strides(a.dims, b.dtype, a.strides or ()), b))


def _touches(kernel: Kernel, group: set[str]) -> tuple[bool, bool]:
    """(reads, writes) any slot of ``group``."""
    return (any(s in group for s in kernel.reads), any(s in group for s in kernel.writes))


def _plain_copy(kernel: Kernel) -> bool:
    return kernel.kind == "reorder" and moves_bytes_only(kernel)


def _removable(slots: dict[str, Slot], kernels: list[Kernel], index: int, ends: set[str]
               ) -> tuple[int, list[int]] | None:
    """(the summing kernel's index, the indices of the copies to run before it) when
    ``kernels[index]`` is a residual copy this pass removes, else None."""
    copy = kernels[index]
    if not _plain_copy(copy):
        return None
    source, target = copy.args.get(int(Arg.SRC)), copy.args.get(int(Arg.DST))
    if source is None or target is None or copy.reads != [source] or copy.writes != [target]:
        return None
    home, offset = root_slot(slots, target)
    root, at = root_slot(slots, source)
    if (at != 0 or offset != 0 or home == target
            or not same_bytes(slots[source].md, slots[target].md)
            or not _same_layout(slots[home].md, slots[source].md)
            or not _same_layout(slots[root].md, slots[source].md)):
        return None
    b_group, d_group = set(alias_group(slots, source)), set(alias_group(slots, home))
    if (b_group & ends or d_group & ends or slots[source].const is not None
            or slots[home].const is not None or slots[home].fill is not None
            or slots[root].fill is not None):
        return None
    summing = next((k for k in range(index + 1, len(kernels))
                    if any(_touches(kernels[k], d_group))), None)
    if summing is None:
        return None
    summer = kernels[summing]
    if (summer.args.get(int(Arg.DST)) not in d_group or "sum" not in summer.info.post_ops
            or _touches(summer, b_group)[0]):
        return None
    if any(_touches(kernels[k], b_group)[1] for k in range(index + 1, len(kernels))):
        return None
    moved: list[int] = []
    for k in range(summing + 1, len(kernels)):
        reads, _ = _touches(kernels[k], b_group)
        if not reads:
            continue
        reader = kernels[k]
        if not _plain_copy(reader) or not all(s in b_group for s in reader.reads):
            return None
        out = set()
        for name in reader.writes:
            out |= set(alias_group(slots, name))
        if out & ends or any(any(_touches(kernels[j], out))
                             for j in range(summing, k) if j not in moved):
            return None
        moved.append(k)
    return summing, moved
