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

import numpy as np

from qfuse.compiler.lower.context import LowerContext
from qfuse.compiler.lower.plan import DynamicOutput
from qfuse.ir import Node
from qfuse.ir.ops import IslandAttrs, IslandEngine
from qfuse.runtime.reference.ops_island import make_runner, make_runner_into

log = logging.getLogger(__name__)


def lower_island(ctx: LowerContext, node: Node) -> None:
    attrs: IslandAttrs = node.attrs
    runner = make_runner(attrs, threads=ctx.options.threads)
    ports: list[int] = []
    constants: list[np.ndarray | None] = []
    reads: list[str] = []
    for port, value in enumerate(node.inputs):
        data = ctx.const(value)
        constants.append(data)
        if data is None:
            ports.append(port)
            reads.append(ctx.plain_source(value))
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

        def run_into(arrays: list[np.ndarray], outs: list[np.ndarray]) -> None:
            args = list(constants)
            for port, array in zip(ports, arrays, strict=True):
                args[port] = array
            into(args, outs)  # type: ignore[arg-type]

        run_into.writes_into = True  # type: ignore[attr-defined]
        note = (f"island ({attrs.engine.value}, {len(attrs.ops)} ONNX nodes, writing its "
                f"outputs in place): {attrs.reason}")
        ctx.add_numpy(node.name, run_into, reads, writes, ctx.info_for(node, note=note),
                      kind="island")
        return

    def run(arrays: list[np.ndarray]) -> list[np.ndarray]:
        args = list(constants)
        for port, array in zip(ports, arrays, strict=True):
            args[port] = array
        results = []
        for out, dtype, cell in zip(runner(args), dtypes, cells, strict=True):  # type: ignore[arg-type]
            if cell is None:
                results.append(np.asarray(out, dtype=dtype))
            else:
                cell.set(np.asarray(out, dtype=dtype))
        return results

    note = f"island ({attrs.engine.value}, {len(attrs.ops)} ONNX nodes): {attrs.reason}"
    log.info("node %s: %s", node, note)
    ctx.add_numpy(node.name, run, reads, writes, ctx.info_for(node, note=note), kind="island")
