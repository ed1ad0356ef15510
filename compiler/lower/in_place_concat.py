"""In-place Concat: producers write straight into the Concat's output, the concat kernel goes.

OpenVINO's CPU plugin runs a Concat "in place" when its inputs can be views of its output
(src/plugins/intel_cpu/src/nodes/concat.cpp, ``Concat::selectOptimalPrimitiveDescriptor``: the
dims before the concat axis are 1 and the layout keeps every input's block contiguous). qfuse
does the same on the lowered plan, before buffers are planned (compiler/lower/plan.py):

Let ``K`` be a concat kernel with a plain dst descriptor ``M`` (strides ``S``) and input ``i``
of dims ``d_i`` starting at ``o_i`` along ``axis``. Input ``i``'s region of the output is the
strided view ``V_i = (d_i, S)`` at byte offset ``b_i = o_i·S[axis]·itemsize``. When ``V_i`` is
*dense* (its bytes are exactly ``[b_i, b_i + |d_i|·itemsize)``, e.g. N = 1 and the axis is the
outermost non-unit dim in memory: a channel concat of row-major tensors, a length concat of
channels-last ``(1, C, L)`` ones) and the input's slot ``s_i`` covers the same bytes as ``V_i``
(``layouts.same_bytes``: the same strides except on size-1 dims), then writing ``s_i`` at
``b_i`` of the output *is* what ``K`` would copy there. So the buffer ``s_i`` lives in — its
alias group, rooted at slot ``r_i`` — is moved into the output: ``r_i`` becomes an alias of the
output's slot at ``b_i - offset(s_i in r_i)``. No descriptor changes, no primitive is recreated.

Preconditions, each checked per input (``_why_not`` says which failed; ``inspect`` prints it):
- every slot of the group lies inside ``s_i``'s bytes (nothing else is moved along);
- the group is neither a graph input, an output, a constant nor a padded source (its border
  must keep its fill), and no kernel after ``K`` reads or writes it (its lifetime ends at
  ``K``: after the move its bytes are the output's, which later kernels may overwrite in
  place);
- its writers come before ``K``; another input does not share its group (``concat(x, x)``).
Regions of distinct inputs are disjoint, so no kernel writes bytes another input still needs.

When every input but one is placed, the last one is copied by a reorder into its view (a
strided view is fine for a reorder); otherwise the concat kernel stays — unless the inputs can
be copied as 4-byte words (``_word_views``): the concat axis is the unit-stride dim (a channel
concat of channels-last tensors) and every input's run along it is whole words. Then each
input not placed is copied by one s32 reorder of its bytes into its view: an integer copy, so
the bytes are moved unchanged whatever the data type. oneDNN 3.2's concat (``simple:any``)
copies such a concat one input run per pixel at a time; four s8 inputs of 24 channels at
120x160 take it 242 us on a 2-core AVX-512 EPYC, four s32 reorders of 6 words per pixel 70 us
(three of 16 channels at 160x160: 169 against 48 us). The concat kernel costs about 3.3 ns a
run (a pixel of one input), a reorder about 3-5 us to start: with fewer than ``WORD_COPY_RUNS``
runs per input the concat kernel is as fast or faster (eight inputs of 28 channels at 28x28,
784 runs each: 22 against 42 us; two of 64 at 28x28: 7.9 against 8.4 us), just above it the
words win (two of 16 at 40x40, 1600 runs: 11.1 against 7.9 us), so below it the concat kernel
stays when no input is placed. Runs that are not whole words are copied the same way, by one
reorder of the input's own data type into its strided view, when oneDNN has a jit reorder for
it (``_jit_copies``): the concat kernel's cost per run does not depend on the run's length, so
short runs are where it loses most. EVA-02's rotary embedding stacks ``(-x2, x1)`` along a new
last axis, an interleave of 1-byte runs: two s8 inputs of (1, 3, 256, 32, 1) took the concat
kernel 109 us, two jit reorders into stride-2 views 12 us; four inputs of 6 s8 channels at
48x40 (6-byte runs): 26 against 17 us; at 24x20 (480 runs, below ``WORD_COPY_RUNS``): 8.4
against 12.3 us. An input whose producer only moves bytes and that nothing else
reads is not copied at all: the producer writes its region (``_producer_move``); then the
concat kernel goes whenever one input at most is left to copy.

Plans are per model and immutable; buffers stay per execution context (runtime/execution.py),
so concurrent runs never share a view.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass

from qfuse.compiler.lower.layouts import repeating_views, same_bytes
from qfuse.compiler.lower.plan import Kernel, Slot, alias_group, moves_bytes_only, root_slot
from qfuse.ir import Graph
from qfuse.ir.ops import Op, ResizeMode
from qfuse.runtime.onednn import Arg, DataType, MemoryDesc, PrimitiveDesc, reorder
from qfuse.runtime.reference.ops_shape import whole_factor_enlargement

log = logging.getLogger(__name__)

WORD = 4  # bytes: inputs are copied as s32 words when their runs along the axis allow it
WORD_COPY_RUNS = 1536  # fewer runs (pixels) per input keep the concat kernel (docstring)


@dataclass
class Placed:
    """What ``place_concats`` did with one concat kernel (for ``inspect``)."""

    concat: str
    in_place: list[int]
    copied: list[int]
    reasons: dict[int, str]
    removed: bool
    words: bool = False  # the copied inputs were moved as 4-byte words
    # inputs whose producer (a copying reorder, a nearest Resize) writes their region itself
    moved: list[int] = dataclasses.field(default_factory=list)


def _axis(graph: Graph, kernel: Kernel) -> int | None:
    node = kernel.info.node
    if node is None or not graph.has_node(node):
        return None
    return getattr(graph.node(node).attrs, "axis", None)


class _Groups:
    """Alias groups of the current slots, and which kernels touch them."""

    def __init__(self, slots: dict[str, Slot], kernels: list[Kernel]) -> None:
        self.slots = slots
        self.members: dict[str, list[tuple[str, int]]] = {}
        for name, slot in slots.items():
            if slot.const is None:
                root, offset = root_slot(slots, name)
                self.members.setdefault(root, []).append((name, offset))
        self.touched: dict[str, list[tuple[int, bool]]] = {}  # root -> (kernel, writes)
        for index, kernel in enumerate(kernels):
            for name in kernel.reads + kernel.writes:
                if slots[name].const is None:
                    root = root_slot(slots, name)[0]
                    self.touched.setdefault(root, []).append((index, name in kernel.writes))


def _why_not(groups: _Groups, slot: str, view: MemoryDesc, index: int, ends: set[str],
             taken: set[str], out_root: str) -> str | None:
    """None when input ``slot`` can be written at its view of the concat output."""
    slots = groups.slots
    md = slots[slot].md
    if slots[slot].const is not None or slots[slot].host is not None:
        return "a constant"
    if view.size != view.nelems * view.numpy_dtype.itemsize:
        return ("its region of the output is not contiguous (dims before the concat axis "
                "are not 1 in the output's layout)")
    if not same_bytes(md, view):
        return f"laid out as {md.describe()}, not as its region {view.describe()}"
    root, offset = root_slot(slots, slot)
    if root == out_root or root in taken:
        return "its buffer is shared with the output or another input"
    for kernel, writes in groups.touched.get(root, ()):
        if kernel > index:
            return "read again after the concat"
        if kernel == index and writes:
            return "written by the concat itself"
    if any(name in ends for name, _ in groups.members[root]):
        return "a graph input or output"
    if slots[root].fill is not None:
        return "a padded source (its border must stay)"
    for name, at in groups.members[root]:
        if at < offset or at + slots[name].md.size > offset + md.size:
            return f"its buffer also holds '{name}' outside its bytes"
    return None


def place_concats(graph: Graph, slots: dict[str, Slot], kernels: list[Kernel],
                  ends: set[str], enabled: bool = True
                  ) -> tuple[dict[str, Slot], list[Kernel], list[Placed]]:
    """Concat kernels in place (module docstring). ``ends``: graph input and output slots;
    ``enabled`` False only reports the concat kernels. Returns the new slots, kernels and
    what was done per concat kernel."""
    slots, out = dict(slots), list(kernels)
    done: list[Placed] = []
    index = 0
    while index < len(out):
        kernel = out[index]
        if kernel.kind != "concat" or kernel.primitive is None:
            index += 1
            continue
        if not enabled:
            done.append(Placed(kernel.name, [], [], dict.fromkeys(
                range(len(kernel.reads)), "in-place concat is switched off"), False))
            index += 1
            continue
        placed = _place_one(graph, slots, out, index, ends)
        done.append(placed)
        index += 0 if placed.removed and not placed.copied else 1
    return slots, out, done


def _place_one(graph: Graph, slots: dict[str, Slot], kernels: list[Kernel], index: int,
               ends: set[str]) -> Placed:
    kernel = kernels[index]
    dst = kernel.args[int(Arg.DST)]
    out_md = slots[dst].md
    srcs = [kernel.args[Arg.multiple_src(i)] for i in range(len(kernel.reads))]
    axis = _axis(graph, kernel)
    result = Placed(kernel.name, [], [], {}, False)
    if axis is None or not out_md.is_plain or slots[dst].host is not None:
        why = "no Concat node behind the kernel" if axis is None else \
            f"the output is not a plain layout ({out_md.describe()})"
        result.reasons = dict.fromkeys(range(len(srcs)), why)
        return result
    axis = axis + len(out_md.dims) if axis < 0 else axis
    groups = _Groups(slots, kernels)
    out_root = root_slot(slots, dst)[0]
    strides = out_md.strides or ()
    itemsize = out_md.numpy_dtype.itemsize
    views: list[tuple[MemoryDesc, int]] = []
    start = 0
    taken: set[str] = set()
    for i, src in enumerate(srcs):
        dims = slots[src].md.dims
        view = MemoryDesc.from_strides(dims, out_md.dtype, strides)
        views.append((view, start * strides[axis] * itemsize))
        start += dims[axis]
        reason = _why_not(groups, src, view, index, ends, taken, out_root)
        if reason is None:
            result.in_place.append(i)
            taken.add(root_slot(slots, src)[0])
        else:
            result.reasons[i] = reason
    rest = [i for i in range(len(srcs)) if i not in result.in_place]
    roots = [root_slot(slots, src)[0] for src in srcs]
    moves = {i: move for i in rest if roots.count(roots[i]) == 1  # not concat(x, x)
             and (move := _producer_move(graph, slots, kernels, index, srcs[i], axis))}
    left = [i for i in rest if i not in moves]
    words = _word_views(slots, [srcs[i] for i in left], out_md, axis)
    many_runs = out_md.nelems >= WORD_COPY_RUNS * out_md.dims[axis]
    # each input left in its own type, where not as words: probed once, kept for the copies
    typed = None if words is not None or not many_runs else _jit_copies(
        slots, [srcs[i] for i in left], [views[i][0] for i in left])
    copies = many_runs and (words is not None or typed is not None)
    # no more kernels than before (one copy at most), or inputs of many runs copied faster
    if not ((len(left) <= 1 and (result.in_place or moves)) or copies):
        return result
    for i in result.in_place:
        root, offset = root_slot(slots, srcs[i])
        members = {name for name, _ in groups.members[root]}
        for writer in kernels[:index]:
            if members.intersection(writer.writes):
                note = (f"writes in place into concat '{kernel.info.node}' (input {i}, "
                        f"byte {views[i][1]})")
                writer.info.add_note(note)
        slots[root] = dataclasses.replace(slots[root], alias=dst,
                                          offset=views[i][1] - offset)
    for i, move in moves.items():  # their producers write into their regions
        move(views[i][0], dst, views[i][1])
        result.moved.append(i)
    replacement: list[Kernel] = []
    for n, i in enumerate(left):  # the inputs left: a reorder each into its view of the output
        view, byte = views[i]
        src, what = srcs[i], f"input {i}"
        if words is not None:
            src_words, view = words[n]
            src = _fresh(slots, f"{srcs[i]}@words")
            slots[src] = Slot(src, src_words, alias=srcs[i])
            what += " as 4-byte words"
        name = _fresh(slots, f"{dst}@input{i}")
        slots[name] = Slot(name, view, alias=dst, offset=byte)
        pd = typed[n] if typed is not None else reorder(slots[src].md, view)
        placed = (f" (inputs {result.in_place} written in place)" if result.in_place
                  else "")
        info = dataclasses.replace(kernel.info, note=f"copies {what} into its part of the "
                                   f"concat's output{placed}", post_ops=[], post_op_details=[])
        replacement.append(Kernel(kernel.name, "reorder", [src], [name], pd.create(),
                                  {int(Arg.SRC): src, int(Arg.DST): name}, info=info))
        result.copied.append(i)
    kernels[index:index + 1] = replacement
    result.removed = True
    result.words = bool(words) and bool(left)
    log.info("concat %s replaced: inputs %s in place, %s copied%s", kernel.name,
             result.in_place, result.copied, " as words" if result.words else "")
    return result


def _producer_move(graph: Graph, slots: dict[str, Slot], kernels: list[Kernel], index: int,
                   src: str, axis: int) -> Callable[[MemoryDesc, str, int], None] | None:
    """How input ``src`` of concat kernel ``index`` can be written straight into its region
    of the output by the kernel that produces it, or None. Only when nothing else reads or
    writes ``src`` (and no view shares its bytes) and that kernel moves bytes only:
    - a reorder without scales, zero points or post-ops (a Split part, a transposing copy):
      the same reorder with the region as its dst;
    - the resampling of a nearest Resize by whole factors, without post-ops: a reorder that
      reads the Resize's source through a view repeating each element along the spatial
      dims (stride 0; output index ``o`` of a dim enlarged k times reads ``o // k``, which
      is the index lower_resize checked oneDNN's nearest reads).
    Both copy 4-byte words where the source and the region allow (``_as_words``). The
    returned function takes ``src``'s region in its own type, the output slot and the
    region's byte offset; ``src`` then becomes that region, so its value can still be read
    there."""
    users = [k for k, kernel in enumerate(kernels) if src in kernel.reads + kernel.writes]
    if alias_group(slots, src) != [src] or len(users) != 2 or users[1] != index:
        return None
    writer = kernels[users[0]]
    source = writer.args.get(int(Arg.SRC))
    if (not moves_bytes_only(writer) or writer.writes != [src] or source is None
            or writer.reads != [source] or slots[source].host is not None
            or slots[source].md.dtype != slots[src].md.dtype):
        return None
    node = graph.node(writer.info.node) if writer.info.node and graph.has_node(
        writer.info.node) else None
    resize = (writer.kind == "resampling" and node is not None and node.op is Op.RESIZE
              and node.attrs.mode is ResizeMode.NEAREST)
    if not resize and writer.kind != "reorder":
        return None
    if resize and (axis != 1 or not slots[source].md.is_plain or not whole_factor_enlargement(
            slots[source].md.dims, slots[src].md.dims)):
        return None

    def move(view: MemoryDesc, dst: str, byte: int) -> None:
        source_md, region = slots[source].md, view
        words = _as_words(source_md, axis), _as_words(view, axis)
        if words[0] is not None and words[1] is not None:
            source_md, region = words
        if resize:
            source_md, region = repeating_views(source_md, region)
        reads = source
        if source_md is not slots[source].md:
            reads = _fresh(slots, f"{source}@{'repeated' if resize else 'words'}")
            slots[reads] = Slot(reads, source_md, alias=source)
        into = _fresh(slots, f"{dst}@{src}")
        slots[into] = Slot(into, region, alias=dst, offset=byte)
        what = "a reorder repeating its source" if resize else "its reorder"
        note = (f"{writer.info.note}; {what} writes straight into its region of concat "
                f"'{kernels[index].info.node}'").lstrip("; ")
        kernels[users[0]] = Kernel(writer.name, "reorder", [reads], [into],
                                   reorder(source_md, region).create(),
                                   {int(Arg.SRC): reads, int(Arg.DST): into},
                                   info=dataclasses.replace(writer.info, note=note))
        slots[src] = Slot(src, view, alias=dst, offset=byte)

    return move


def _word_views(slots: dict[str, Slot], srcs: list[str], out_md: MemoryDesc, axis: int
                ) -> list[tuple[MemoryDesc, MemoryDesc]] | None:
    """Per input, (its bytes, its region of the output) as s32 words, when the concat axis is
    the unit-stride dim of the output and of every input, every input's run along it is whole
    words and so is every other stride; None otherwise (or for a constant or host input)."""
    out_words = _as_words(out_md, axis)
    if out_words is None:
        return None
    found = []
    for src in srcs:
        slot = slots[src]
        words = None if slot.const is not None or slot.host is not None else \
            _as_words(slot.md, axis)
        if words is None:
            return None
        found.append((words, MemoryDesc.from_strides(words.dims, DataType.s32,
                                                     out_words.strides or ())))
    return found


def _jit_copies(slots: dict[str, Slot], srcs: list[str], views: list[MemoryDesc]
                ) -> list[PrimitiveDesc] | None:
    """Per input, the reorder copying it into its region of the output, when each is one of
    oneDNN's jit reorders (not a constant or host input; not a ``simple:`` / ``ref:`` reorder,
    which copy an element at a time like the concat kernel); None otherwise."""
    pds = []
    for src, view in zip(srcs, views):
        slot = slots[src]
        if slot.const is not None or slot.host is not None:
            return None
        pd = reorder(slot.md, view)
        if not pd.impl_name.startswith("jit"):
            return None
        pds.append(pd)
    return pds


def _as_words(md: MemoryDesc, axis: int) -> MemoryDesc | None:
    """``md``'s bytes as s32 words along ``axis`` (see ``_word_views``), or None."""
    if not md.is_plain or md.strides is None or md.strides[axis] != 1:
        return None
    size = md.numpy_dtype.itemsize
    dims, strides = list(md.dims), [st * size for st in md.strides]
    if (dims[axis] * size) % WORD or any(
            d > 1 and st % WORD for k, (d, st) in enumerate(zip(dims, strides)) if k != axis):
        return None
    dims[axis] = dims[axis] * size // WORD
    strides = [1 if k == axis else st // WORD for k, st in enumerate(strides)]
    return MemoryDesc.from_strides(dims, DataType.s32, strides)


def _fresh(slots: dict[str, Slot], base: str) -> str:
    name, count = base, 0
    while name in slots:
        count += 1
        name = f"{base}#{count}"
    return name
