"""Issue 5 on the ResNet-50-size model (bottlenecks [3, 4, 6, 3], 224×224, 1000 classes):
fused int8 against onnxruntime's default session and against the reference interpreter.

Reference agreement is measured per kernel: each fused kernel's output, recomputed from the
plan's own inputs, is bit-exact against the oneDNN attributes it was given and within 1 LSB of
the chain's meaning (2 where the chain holds an inner quantization), since the composer's
float32 constant folding moves near-ties (tests/passes/test_composer.py). Per kernel, because
end to end a single flip cascades through 50 layers (tests/compiler/
test_reference_vs_onnxruntime.py shows ONNX Runtime itself reaching 11 LSB that way); end to
end the check is top-1 and cosine against onnxruntime.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from qfuse.compiler.api import compile_model
from qfuse.compiler.lower.no_vnni import EXCESS, LOW_HALF
from qfuse.examples.zoo import model_path, sample_inputs
from qfuse.ir.chain import Quantize
from qfuse.runtime.numerics import cosine
from qfuse.runtime.reference.interpreter import run_node


@pytest.fixture(scope="module")
def resnet50():
    path = model_path("resnet50", quantized=True)
    return path, compile_model(path, threads=2)


def test_fused_matches_onnxruntime(resnet50) -> None:
    path, model = resnet50
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for feeds in sample_inputs(onnx.load(path), 2, seed=1):
        ours = model.run(feeds)[model.outputs[0]]
        theirs = session.run(None, feeds)[0]
        assert ours.argmax() == theirs.argmax()
        assert cosine(ours, theirs) >= 0.999


def test_no_reference_kernels_and_no_reorders(resnet50) -> None:
    _, model = resnet50
    info = model.inspect()
    compute = [k for k in info["kernels"] if k["primitive"] in ("convolution", "matmul")]
    extra = (LOW_HALF, EXCESS)  # no VNNI: one more kernel per split convolution
    assert len([k for k in compute if k.get("exact_int8") not in extra]) == 54
    assert not [k["impl"] for k in compute if k["impl"].startswith("ref")]
    assert info["reorders"] == 0 and info["in_place_sums"] == 16


def test_every_fused_kernel_matches_the_reference_given_the_same_inputs(resnet50) -> None:
    path, model = resnet50
    feeds = sample_inputs(onnx.load(path), 1, seed=1)[0]
    values = model.run_all(feeds, as_planned=True)  # read by the compiled graph's nodes
    graph = model.compiled_graph
    worst, identical = 0, 1.0
    for node in graph.topo_order():
        if node.fused is None or node.outputs[0] not in values:
            continue
        args = [None if not v else (graph.constant(v) if graph.constant(v) is not None
                                    else values[v]) for v in node.inputs]
        got = values[node.outputs[0]]
        composed = run_node(node, args, graph, composed=True)[0]
        assert np.array_equal(composed, got), node.name  # oneDNN does what it was asked
        ref = run_node(node, args, graph)[0]
        diff = np.abs(ref.astype(np.int64) - got.astype(np.int64))
        # A chain with an inner quantization (conv → Q → DQ → residual add → Q) can flip the
        # inner rounding at a near-tie too; carried to the output that is 1 more step.
        inner = sum(isinstance(item, Quantize) for item in node.fused.chain) > 1
        assert diff.max() <= (2 if inner else 1), node.name
        worst, identical = max(worst, int(diff.max())), min(identical, float(np.mean(diff == 0)))
    assert identical >= 0.999, (worst, identical)
