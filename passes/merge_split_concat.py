"""A Concat of consecutive outputs of one Split reads the slice of the Split's source they make.

``Split(x, axis)`` cuts ``x`` into consecutive parts along ``axis``; a ``Concat`` along the
same axis of parts ``k, k+1, …, j`` in that order puts back exactly ``x``'s elements
``[start_k, end_j)`` along the axis: ``Concat(…, Split(x)[k], …, Split(x)[j], …)`` equals
``Concat(…, Slice(x, start_k, end_j), …)``, and ``x`` itself when the parts are all of them
(ONNX Split and Concat: https://onnx.ai/onnx/operators/onnx__Split.html,
https://onnx.ai/onnx/operators/onnx__Concat.html). Exact: bytes move, nothing is computed.

Why: YOLOv8's C2f block (and YOLO11's C3k2) splits a convolution's output into two halves,
runs its bottlenecks on the second and concatenates both halves with the bottlenecks'
outputs. A Split output is a view of its source, and a channel region of a channels-last
concat output is not dense, so each half was copied into the concat's output by a kernel of
its own (compiler/lower/in_place_concat.py); read as one slice, the two halves are one copy.
The second half's own dense copy for the bottleneck that reads it stays.

Applied when the parts have the source's data type and quantization (a Split moves values
unchanged, so they do unless another pass changed one of them) and the run has two parts or
more; the Split stays for its other readers and goes when it has none. Composer option
``merge_split_concat`` (on by default).
"""

from __future__ import annotations

import logging

from qfuse.ir import Graph, Node, Op
from qfuse.ir.ops import SliceAttrs, SplitAttrs
from qfuse.passes.base import PassContext
from qfuse.passes.quant_utils import infer_into

log = logging.getLogger(__name__)


def run(graph: Graph, ctx: PassContext) -> int:
    if not ctx.composer.on("merge_split_concat"):
        return 0
    changed = 0
    for node in [n for n in graph.topo_order() if n.op is Op.CONCAT]:
        inputs = _merged(graph, node)
        if inputs is None:
            continue
        ctx.visit(node)
        graph.set_inputs(node, inputs)
        changed += 1
    if changed:
        graph.remove_unused()  # Splits none of whose parts are read any more
    return changed


def _merged(graph: Graph, concat: Node) -> list[str] | None:
    """``concat``'s inputs with each run of consecutive parts of one Split replaced by the
    slice of its source they make; None when there is no such run."""
    runs: list[list] = []  # [the Split or None, first part, last part, the input]
    for value in concat.inputs:
        split, part = _part(graph, value, concat.attrs.axis)
        last = runs[-1] if runs else None
        if split is not None and last is not None and last[0] is split and last[2] + 1 == part:
            last[2] = part
        else:
            runs.append([split, part, part, value])
    if all(first == last for _, first, last, _ in runs):
        return None
    return [value if first == last else _slice(graph, split, first, last, concat)
            for split, first, last, value in runs]


def _part(graph: Graph, value: str, axis: int) -> tuple[Node | None, int]:
    """(the Split writing ``value``, its output index) when it splits along ``axis`` and its
    parts move values unchanged, else (None, -1)."""
    split = graph.producer(value)
    if split is None or split.op is not Op.SPLIT:
        return None, -1
    attrs: SplitAttrs = split.attrs
    source = graph.info(split.inputs[0])
    info = graph.info(value)
    if (attrs.axis % source.rank != axis % source.rank or info.dtype != source.dtype
            or info.quant != source.quant):
        return None, -1
    return split, split.outputs.index(value)


def _slice(graph: Graph, split: Node, first: int, last: int, concat: Node) -> str:
    """The value holding parts ``first``..``last`` of ``split``'s source: the source itself
    when they are all of it, else a new Slice of it."""
    attrs: SplitAttrs = split.attrs
    source = split.inputs[0]
    if first == 0 and last == len(attrs.sizes) - 1:
        log.debug("%s reads %s whole instead of all its parts", concat, source)
        return source
    start = sum(attrs.sizes[:first])
    end = start + sum(attrs.sizes[first:last + 1])
    node = graph.add_node(Op.SLICE, [source], 1,
                          SliceAttrs(starts=(start,), ends=(end,), axes=(attrs.axis,),
                                     steps=(1,)),
                          name=graph.unique_name(f"{split.name}/parts{first}-{last}"),
                          origin=split.origin)
    infer_into(graph, node)
    log.debug("%s reads parts %d-%d of %s as one slice", concat, first, last, split)
    return node.outputs[0]
