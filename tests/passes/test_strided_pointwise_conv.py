"""strided_pointwise_conv: a 1x1 convolution with strides reads a strided Slice with unit
strides. oneDNN's own reduce-to-unit-stride copy on jit_uni_int8_1x1 returned wrong values on
some runs (the fuzz campaign's seed 41245, minimised: u8 [2, 8, 8, 2] → 1x1 conv stride 2x1 →
GlobalAveragePool; 57 of 300 runs wrong before); now every run equals the reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from qfuse.compiler.api import compile_model, import_graph
from qfuse.ir import Op
from qfuse.passes import strided_pointwise_conv
from qfuse.passes.base import PassContext
from tests.fuzz.generator import Spec, fuzz_inputs

MODEL = Path(__file__).parents[1] / "fuzz" / "regressions" / "strided_pointwise_conv_41245.onnx"


def test_every_run_of_a_strided_pointwise_conv_equals_the_reference() -> None:
    model = onnx.load(MODEL)
    spec = Spec.from_json({p.key: p.value for p in model.metadata_props}["fuzz_spec"])
    feeds = fuzz_inputs(spec)
    want = compile_model(model, mode="reference").run(feeds)
    wrong = 0
    for _ in range(20):
        compiled = compile_model(model, threads=2)
        convs = [k for k in compiled.inspect()["kernels"] if k["primitive"] == "convolution"]
        assert len(convs) == 1
        for _ in range(3):
            got = compiled.run(feeds)
            wrong += not all(np.array_equal(got[k], want[k]) for k in want)
    assert wrong == 0, f"{wrong} of 60 runs differ from the reference"


def test_the_convolution_runs_with_unit_strides_after_a_slice() -> None:
    compiled = compile_model(MODEL)
    assert compiled.inspect()["passes"]["strided_pointwise_conv"] == 1
    graph = compiled.compiled_graph
    conv = next(n for n in graph.topo_order() if n.op.value == "Conv")
    assert conv.attrs.strides == (1, 1)
    producer = graph.producer(conv.inputs[0])
    assert producer is not None and producer.op.value == "Slice"
    assert producer.attrs.steps == (2, 1)


def test_the_slice_keeps_its_inputs_channel_order() -> None:
    """A source whose channels pair_channels reordered (no VNNI) gives the Slice the same
    order, so run_all reads its value in the model's channel order (it read it in the
    plan's)."""
    graph = import_graph(onnx.load(MODEL))
    conv = next(n for n in graph.topo_order() if n.op is Op.CONV)
    x = conv.inputs[0]
    order = np.random.default_rng(0).permutation(graph.info(x).shape[1])
    graph.channel_orders[x] = order
    assert strided_pointwise_conv.run(graph, PassContext()) == 1
    np.testing.assert_array_equal(graph.channel_orders[conv.inputs[0]], order)
