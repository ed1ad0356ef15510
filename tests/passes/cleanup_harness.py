"""What the import-cleanup pass tests share: running one pass the way the pipeline does,
the reference interpreter before vs after, and float32 distances in ulps.

``ulps(a, b)``: the number of float32 values between a and b (0 = identical bits, 1 = adjacent
floats; +0 and -0 are 0 apart), computed on the sign-magnitude bit patterns mapped onto a
monotonic integer line.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

from qfuse.ir import Graph
from qfuse.ir.shapes import infer_shapes
from qfuse.passes.base import PassResult
from qfuse.runtime.reference import evaluate
from tests.passes.quant_helpers import apply, reasons, ulps
from tests.passes.quant_helpers import feeds as random_feeds

__all__ = ["apply", "random_feeds", "reasons", "ulps"]


def finish(graph: Graph, outputs: list[str]) -> Graph:
    """Set the graph outputs, infer every info and verify (hand-built graphs)."""
    graph.outputs = list(outputs)
    infer_shapes(graph)
    graph.verify()
    return graph


def op_sequence(graph: Graph) -> list[str]:
    return [node.op.value for node in graph.topo_order()]


def before_after(module: ModuleType, graph: Graph, seeds: int = 3
                 ) -> tuple[PassResult, list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]]:
    """Outputs of the reference on random feeds before and after the pass."""
    feeds = [random_feeds(graph, seed) for seed in range(seeds)]
    before = [evaluate(graph, f) for f in feeds]
    result = apply(module, graph)
    after = [evaluate(graph, f) for f in feeds]
    return result, list(zip(before, after, strict=True))


def assert_bit_exact(pairs: list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]) -> None:
    for before, after in pairs:
        assert before.keys() == after.keys()
        for name in before:
            assert after[name].dtype == before[name].dtype, name
            assert np.array_equal(after[name], before[name], equal_nan=True), name


def ulp_of(x: np.ndarray) -> np.ndarray:
    """The float32 spacing at |x|."""
    return np.spacing(np.abs(np.asarray(x, dtype=np.float32)))
