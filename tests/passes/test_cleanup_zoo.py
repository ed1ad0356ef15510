"""The nine import-cleanup passes on every small zoo model, float and quantized (QDQ).

Each model is imported, the cleanup passes run through run_pass in pipeline order (the graph
verified after each), and the reference interpreter's outputs before and after are compared:
``max |after - before| <= 1e-5 · max |before|`` per output (measured: at most 2.1e-7 on the
float models — BN folding and Gemm's double rounding — and 0 on the quantized ones, whose
float differences never moved a QuantizeLinear step on these inputs). Afterwards no
BatchNormalization, Gemm, Identity, Dropout or Sum remains, and in the quantized models every
integer weight is still an integer constant behind its DequantizeLinear (Gemm weights
transposed: the multiset of integer values per tensor is unchanged).
"""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pytest

from qfuse.compiler.onnx_import import import_model
from qfuse.compiler.pipeline import PIPELINE
from qfuse.examples import zoo
from qfuse.ir import Graph, Op
from qfuse.passes.base import PassContext, run_pass
from qfuse.runtime.reference import evaluate

CLEANUP = ["drop_identity", "constant_fold", "fold_constant_cones", "merge_duplicates",
           "distribute_concat", "fold_batchnorm", "decompose_batchnorm", "gemm_to_matmul",
           "canonicalize_arith"]
GONE = {Op.BATCH_NORM, Op.GEMM, Op.IDENTITY, Op.DROPOUT, Op.SUM}
TOLERANCE = 1e-5


def run_cleanup(graph: Graph) -> dict[str, int]:
    assert [name for name, _ in PIPELINE[:len(CLEANUP)]] == CLEANUP
    ctx = PassContext()
    changed = {}
    for name, fn in PIPELINE[:len(CLEANUP)]:
        result = run_pass(name, fn, graph, ctx)
        graph.verify()
        changed[name] = result.changed
    return changed


def integer_weights(graph: Graph) -> Counter[tuple[str, tuple[int, ...], bytes]]:
    """Per DequantizeLinear of an integer constant: dtype, sorted shape, sorted values."""
    found: Counter[tuple[str, tuple[int, ...], bytes]] = Counter()
    for node in graph.topo_order():
        data = graph.constant(node.inputs[0]) if node.op is Op.DEQUANTIZE_LINEAR else None
        if data is not None:
            found[(str(data.dtype), tuple(sorted(data.shape)), np.sort(data, None).tobytes())] += 1
    return found


def compare(graph: Graph, feeds: list[dict[str, np.ndarray]],
            before: list[dict[str, np.ndarray]]) -> None:
    for feed, expected in zip(feeds, before, strict=True):
        got = evaluate(graph, feed)
        assert got.keys() == expected.keys()
        for name, want in expected.items():
            assert got[name].shape == want.shape and got[name].dtype == want.dtype
            err = np.max(np.abs(got[name].astype(np.float64) - want))
            assert err <= TOLERANCE * np.max(np.abs(want)), (name, err)


@pytest.mark.parametrize("name", zoo.SMALL_ARCHITECTURES)
def test_float_model(name: str) -> None:
    model = zoo.float_model(name)
    graph = import_model(model)
    ops = Counter(node.op for node in graph.topo_order())
    feeds = zoo.sample_inputs(model, 2, seed=1)
    before = [evaluate(graph, f) for f in feeds]
    changed = run_cleanup(graph)
    assert changed["fold_batchnorm"] == ops[Op.BATCH_NORM]
    assert changed["gemm_to_matmul"] == ops[Op.GEMM]
    assert not GONE & {node.op for node in graph.topo_order()}
    assert graph.outputs == [o.name for o in model.graph.output]
    compare(graph, feeds, before)


@pytest.mark.parametrize("name", zoo.SMALL_ARCHITECTURES)
def test_quantized_model(name: str) -> None:
    model = zoo.quantized_model(name)
    graph = import_model(model)
    ops = Counter(node.op for node in graph.topo_order())
    weights = integer_weights(graph)
    feeds = zoo.sample_inputs(model, 2, seed=1)
    before = [evaluate(graph, f) for f in feeds]
    changed = run_cleanup(graph)
    assert changed["gemm_to_matmul"] == ops[Op.GEMM]
    after_ops = Counter(node.op for node in graph.topo_order())
    assert not GONE & set(after_ops)
    for op in (Op.DEQUANTIZE_LINEAR, Op.QUANTIZE_LINEAR):  # only merge_duplicates drops them
        merged = sum(len(n.origin) - 1 for n in graph.topo_order() if n.op is op)
        # distribute_concat gives each concat input its copy of a pair, named <node>/part<i>
        copies = Counter(re.sub(r"/part\d+$", "", n.name) for n in graph.topo_order()
                         if n.op is op and re.search(r"/part\d+$", n.name))
        assert after_ops[op] + merged - sum(c - 1 for c in copies.values()) == ops[op], op
    assert integer_weights(graph) == weights
    assert graph.outputs == [o.name for o in model.graph.output]
    compare(graph, feeds, before)
