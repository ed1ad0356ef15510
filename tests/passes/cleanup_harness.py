"""What the import-cleanup pass tests share: running one pass the way the pipeline does,
the reference interpreter before vs after, and float32 distances in ulps.

``ulps(a, b)``: the number of float32 values between a and b (0 = identical bits, 1 = adjacent
floats; +0 and -0 are 0 apart), computed on the sign-magnitude bit patterns mapped onto a
monotonic integer line.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

from ir import Graph
from ir.shapes import infer_shapes
from passes.base import PassContext, PassResult, run_pass
from runtime.reference import evaluate


def apply(module: ModuleType, graph: Graph, ctx: PassContext | None = None) -> PassResult:
    """Run the pass in ``module`` through run_pass, then verify the graph."""
    name = module.__name__.rsplit(".", 1)[-1]
    result = run_pass(name, module.run, graph, ctx or PassContext())
    graph.verify()
    return result


def finish(graph: Graph, outputs: list[str]) -> Graph:
    """Set the graph outputs, infer every info and verify (hand-built graphs)."""
    graph.outputs = list(outputs)
    infer_shapes(graph)
    graph.verify()
    return graph


def op_sequence(graph: Graph) -> list[str]:
    return [node.op.value for node in graph.topo_order()]


def reasons(result: PassResult) -> list[str]:
    return [d.reason for d in result.declined]


def random_feeds(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for name in graph.inputs:
        info = graph.info(name)
        if info.dtype.is_integer:
            low, high = info.dtype.range
            feeds[name] = rng.integers(low, high + 1, info.shape).astype(info.dtype.np)
        else:
            feeds[name] = rng.standard_normal(info.shape).astype(info.dtype.np)
    return feeds


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


def _ordered(x: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.int32).astype(np.int64)
    return np.where(bits < 0, -(bits & 0x7FFFFFFF), bits)


def ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Element-wise distance between float32 arrays in units in the last place."""
    return np.abs(_ordered(a) - _ordered(b))


def ulp_of(x: np.ndarray) -> np.ndarray:
    """The float32 spacing at |x|."""
    return np.spacing(np.abs(np.asarray(x, dtype=np.float32)))
