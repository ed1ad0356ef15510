"""numpy kernels: the reference semantics (runtime/reference) for ops oneDNN has no primitive for.

A numpy kernel reads plain row-major arrays and writes plain row-major arrays: its inputs are
reordered to plain first when their producer chose another layout. It calls the reference
interpreter's implementation of the op (``IMPLS``), so it computes exactly what `reference`
mode computes. `inspect` shows these kernels with impl "numpy". Used for Resize, Pad, Cast,
and the cases the oneDNN lowerings decline (each passes a note saying why). A fused node (an
int8 average pooling with its chain) evaluates its fused semantics: the oneDNN attributes the
composer chose (``evaluate_fused(..., composed=True)``, runtime/reference/fused.py), what a
oneDNN kernel would have computed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from qfuse.compiler.errors import UnsupportedModelError
from qfuse.compiler.lower.context import LowerContext
from qfuse.ir import Node
from qfuse.runtime.reference import IMPLS
from qfuse.runtime.reference.interpreter import run_node

log = logging.getLogger(__name__)


def numpy_inputs(ctx: LowerContext, node: Node
                 ) -> tuple[list[str], Callable[[list[np.ndarray]], list[np.ndarray | None]]]:
    """For a numpy kernel of ``node``: the slots it reads (its run-time inputs, row-major or
    host), and a function giving every input in port order from those arrays, the constants
    taken once here (None where an input is absent)."""
    ports: list[int] = []  # input ports read from slots; others are constants or absent
    constants: list[np.ndarray | None] = []
    reads: list[str] = []
    for port, value in enumerate(node.inputs):
        data = ctx.const(value) if value else None
        constants.append(data)
        if value and data is None:
            ports.append(port)
            reads.append(ctx.plain_source(value))

    def inputs(arrays: list[np.ndarray]) -> list[np.ndarray | None]:
        args = list(constants)
        for port, array in zip(ports, arrays, strict=True):
            args[port] = array
        return args

    return reads, inputs


def lower_numpy(ctx: LowerContext, node: Node, note: str = "") -> None:
    """One numpy kernel computing ``node`` with its reference implementation."""
    impl = IMPLS.get(node.op)
    if impl is None:
        raise UnsupportedModelError(f"node {node}: no oneDNN lowering and no numpy "
                                    f"implementation of {node.op.value}")
    reads, inputs = numpy_inputs(ctx, node)
    writes = []
    dtypes = []
    for value in node.outputs:
        writes.append(ctx.define_plain(value))
        dtypes.append(ctx.info(value).dtype.np)

    graph, composed = ctx.graph, "composed" in node.meta

    def run(arrays: list[np.ndarray]) -> list[np.ndarray]:
        args = inputs(arrays)
        outs = run_node(node, args, graph, composed=composed) if node.fused else impl(node, args)
        return [np.asarray(out, dtype=dt) for out, dt in zip(outs, dtypes, strict=True)]

    why = note or f"oneDNN has no {node.op.value} primitive"
    log.info("node %s runs in numpy: %s", node, why)
    ctx.add_numpy(node.name, run, reads, writes, ctx.info_for(node, note=why))
