"""Island kernels: a float island (ir.ops.IslandAttrs) runs as one kernel calling its engine.

The kernel reads plain row-major (or host) slots and writes them, like a numpy kernel
(fallback.py), and calls the runner ``runtime.reference.ops_island.make_runner`` built here,
once, at compile time: an onnxruntime InferenceSession (ORT_DISABLE_ALL, see ops_island) or an
onnx.reference evaluator, per the island's engine. Outputs whose shape is only known at run
time are graph outputs (the importer guarantees it); the kernel hands them to the executor
through the plan's ``DynamicOutput`` cells instead of slots. The kernel keeps no state between
runs; `inspect` shows it with primitive "island", its engine and why the nodes are an island.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import numpy as np
import onnx
from onnx import numpy_helper

from qfuse.compiler.lower.context import LowerContext
from qfuse.compiler.lower.fallback import numpy_inputs
from qfuse.compiler.lower.layouts import dnnl_type, gapless, is_row_major, md_like, plain_md
from qfuse.compiler.lower.lower_rnn import lower_recurrent
from qfuse.compiler.lower.plan import DynamicOutput
from qfuse.ir import Node
from qfuse.ir.ops import UNARY_ELEMENTWISE, IslandAttrs, IslandEngine, TableAttrs
from qfuse.runtime.onednn import DataType, MemoryDesc
from qfuse.runtime.reference.ops_island import make_runner, make_runner_into

log = logging.getLogger(__name__)


def _any_order(ctx: LowerContext, node: Node) -> MemoryDesc | None:
    """The producer's layout of the island's one input when the island is unary elementwise
    ops on it and that layout is dense but not row-major (a convolution's channels-last
    float32 output before a GELU's Erf): the island then reads and writes the bytes in that
    order, seen as its declared shape, instead of reordering to row-major and back."""
    attrs: IslandAttrs = node.attrs
    if (attrs.engine is not IslandEngine.ONNXRUNTIME or any(attrs.dynamic)
            or not set(attrs.ops) <= UNARY_ELEMENTWISE
            or len(node.inputs) != 1 or len(node.outputs) != 1):
        return None
    x, y = node.inputs[0], node.outputs[0]
    if ctx.const(x) is not None or ctx.info(x).shape != ctx.info(y).shape or ctx.info(
            x).dtype is not ctx.info(y).dtype:
        return None
    md = ctx.md_of(x)
    if not gapless(md) or is_row_major(md):
        return None
    return md


def _flat_views(ctx: LowerContext, x: str, y: str, md: MemoryDesc, y_type: DataType
                ) -> tuple[str, str]:
    """Slots over x's bytes (``md``, dense) and y's, seen as one dim each: y is laid out as
    x, its home the view the kernel writes. An elementwise kernel computes the same bytes."""
    flat = (md.nelems,)
    src = ctx.temp(f"{x}@flat", plain_md(flat, md.dtype), alias=ctx.home_slot(x))
    dst = ctx.temp(f"{y}@flat", plain_md(flat, y_type))
    laid = md_like(md, y_type)
    assert laid is not None
    ctx.define(y, laid, alias=dst)
    return src, dst


def _scatter_replaces_all(ctx: LowerContext, node: Node) -> str | None:
    """A ScatterND island (reduction none) whose constant indices name every element of the
    data once, in row-major order, with updates of the data's shape: its output is the
    updates (torch's in-place ``attn[:, :, 0:, 0:] = attn + rel`` exported over the whole
    tensor: MViTv2's decomposed relative positions, 1.6 ms a kernel in onnxruntime). The
    updates' value, or None."""
    attrs: IslandAttrs = node.attrs
    if attrs.ops != ("ScatterND",) or any(attrs.dynamic):
        return None
    model = onnx.load_from_string(attrs.model)
    (onnx_node,) = model.graph.node
    reduction = next((a.s.decode() for a in onnx_node.attribute if a.name == "reduction"),
                     "none")
    ports = {i.name: port for port, i in enumerate(model.graph.input)}  # the node's inputs
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    data_name, index_name, updates_name = onnx_node.input
    if data_name not in ports or updates_name not in ports:
        return None
    data, updates = node.inputs[ports[data_name]], node.inputs[ports[updates_name]]
    index = inits.get(index_name)
    if index is None and index_name in ports:
        index = ctx.const(node.inputs[ports[index_name]])
    shape = ctx.info(data).shape
    if (reduction != "none" or index is None or ctx.info(updates).shape != shape
            or ctx.info(updates).dtype is not ctx.info(data).dtype
            or index.shape[-1] != len(shape) or index.size // len(shape) != math.prod(shape)):
        return None
    index = index.reshape(-1, len(shape))
    index = np.where(index < 0, index + np.asarray(shape), index)  # ONNX: -d .. d-1
    if np.any(index < 0) or np.any(index >= np.asarray(shape)):
        return None  # out of range: onnxruntime's error, not a quiet alias
    flat = np.ravel_multi_index(tuple(index.T), shape)
    return updates if np.array_equal(flat, np.arange(math.prod(shape))) else None


def lower_island(ctx: LowerContext, node: Node) -> None:
    attrs: IslandAttrs = node.attrs
    lowered, why_not = lower_recurrent(ctx, node)
    if lowered:
        return
    updates = _scatter_replaces_all(ctx, node)
    if updates is not None:  # the updates themselves, as an Identity is
        ctx.home[node.outputs[0]] = ctx.home_slot(updates)
        return
    md = _any_order(ctx, node)
    if md is not None:
        _lower_in_any_order(ctx, node, md)
        return
    runner = make_runner(attrs, threads=ctx.options.threads)
    reads, with_constants = numpy_inputs(ctx, node)
    writes: list[str] = []
    cells: list[DynamicOutput | None] = []
    dtypes = []
    for value, dynamic in zip(node.outputs, attrs.dynamic, strict=True):
        dtypes.append(ctx.info(value).dtype.np)
        if dynamic:
            cell = ctx.dynamic[value] = DynamicOutput()
            cells.append(cell)
        else:
            writes.append(ctx.define_plain(value))
            cells.append(None)

    if attrs.engine is IslandEngine.ONNXRUNTIME and not any(attrs.dynamic):
        into = make_runner_into(attrs, threads=ctx.options.threads)
        _add_in_place(ctx, node, lambda arrays, outs: into(with_constants(arrays), outs),
                      reads, writes, "writing its outputs in place", why_not)
        return

    def run(arrays: list[np.ndarray]) -> list[np.ndarray]:
        results = []
        for out, dtype, cell in zip(runner(with_constants(arrays)),  # type: ignore[arg-type]
                                    dtypes, cells, strict=True):
            if cell is None:
                results.append(np.asarray(out, dtype=dtype))
            else:
                cell.set(np.asarray(out, dtype=dtype))
        return results

    note = f"island ({attrs.engine.value}, {len(attrs.ops)} ONNX nodes): {attrs.reason}"
    note += f"; {why_not}" if why_not else ""
    log.info("node %s: %s", node, note)
    ctx.add_numpy(node.name, run, reads, writes, ctx.info_for(node, note=note), kind="island")


def _lower_in_any_order(ctx: LowerContext, node: Node, md: MemoryDesc) -> None:
    """The island on flat views of its input's bytes and of an output in the same layout
    (``_any_order``), through onnxruntime's IOBinding."""
    attrs: IslandAttrs = node.attrs
    x, y = node.inputs[0], node.outputs[0]
    shape = ctx.info(x).shape
    src, dst = _flat_views(ctx, x, y, md, md.dtype)
    into = make_runner_into(attrs, threads=ctx.options.threads)
    _add_in_place(ctx, node,
                  lambda arrays, outs: into([arrays[0].reshape(shape)], [outs[0].reshape(shape)]),
                  [src], [dst],
                  f"elementwise: on its input's own layout, {md.describe()}, outputs in place")


def _add_in_place(ctx: LowerContext, node: Node,
                  fn: Callable[[list[np.ndarray], list[np.ndarray]], None],
                  reads: list[str], writes: list[str], how: str, why_not: str = "") -> None:
    """An island kernel whose ``fn(inputs, outputs)`` writes the output views itself;
    ``why_not``: why a faster lowering declined it, for the note."""
    attrs: IslandAttrs = node.attrs
    note = f"island ({attrs.engine.value}, {len(attrs.ops)} ONNX nodes, {how}): {attrs.reason}"
    note += f"; {why_not}" if why_not else ""
    ctx.add_numpy(node.name, fn,  # type: ignore[arg-type]  (fn(inputs, outputs), into=True)
                  reads, writes, ctx.info_for(node, note=note), kind="island", into=True)


def lower_table(ctx: LowerContext, node: Node) -> None:
    """``y = T[x]`` (ir.ops.TableAttrs, passes/table_lookup.py): numpy's ``take`` over x's
    bytes in x's own layout when it is dense (y in the same layout), else row-major."""
    attrs: TableAttrs = node.attrs
    x, y = node.inputs[0], node.outputs[0]
    md = ctx.md_of(x)
    if gapless(md):
        src, dst = _flat_views(ctx, x, y, md, dnnl_type(attrs.info.dtype))
    else:
        src, dst = ctx.plain_source(x), ctx.define_plain(y)
    by_byte = attrs.by_byte
    by_pair = pair_table(by_byte)

    def take(arrays: list[np.ndarray], outs: list[np.ndarray]) -> None:
        q, out = arrays[0].reshape(-1).view(np.uint8), outs[0].reshape(-1).view(np.uint8)
        even = q.size - q.size % 2
        # every index is a uint16, below the table's 65536 entries: "wrap" never wraps, and
        # numpy's take then skips the bounds check "raise" makes per element (602112 bytes:
        # 181 → 145 us, 2-core AMD EPYC)
        np.take(by_pair, q[:even].view(np.uint16), out=out[:even].view(np.uint16),
                mode="wrap")
        if even < q.size:  # an odd count: the last byte alone
            out[-1] = by_byte[q[-1]]

    note = (f"a table of x's 256 values for {len(attrs.nodes)} ONNX nodes "
            f"({', '.join(attrs.ops)}): y = T[x], two bytes per look-up")
    ctx.add_numpy(node.name, take,  # type: ignore[arg-type]  (fn(inputs, outputs), into=True)
                  [src], [dst], ctx.info_for(node, note=note), into=True)


def pair_table(by_byte: np.ndarray) -> np.ndarray:
    """The table of two neighbouring bytes at once, 65536 uint16 entries (128 KiB): numpy's
    ``take`` then looks up half as many elements, 0.55 → 0.32 ns a byte (measured, 602112
    bytes at one thread). Entry i holds T of the two bytes of i as it lies in memory."""
    pairs = np.arange(65536, dtype=np.uint16).view(np.uint8).reshape(-1, 2)
    return np.ascontiguousarray(by_byte[pairs]).view(np.uint16).reshape(-1)
