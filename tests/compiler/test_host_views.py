"""A Reshape / Unsqueeze / Squeeze / Flatten / Identity of a run-time host value (int64,
bool: oneDNN has no type for them) is a view of the same bytes, no kernel
(compiler/lower/table.py ``_host_view``); it was a numpy copy. The values as onnxruntime's."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from qfuse.compiler.api import compile_model
from tests.compiler.onnx_builders import init, model, run_ort


def test_an_attention_masks_unsqueezes_are_views() -> None:
    """BERT's extended mask: Unsqueeze(1), Unsqueeze(2) of an int64 [B, T] mask, Cast,
    (1 − m)·(−1e4) added to scores; the unsqueezed int64 mask is also an output."""
    nodes = [helper.make_node("Unsqueeze", ["mask", "a1"], ["m1"]),
             helper.make_node("Unsqueeze", ["m1", "a2"], ["m2"]),
             helper.make_node("Identity", ["m2"], ["m3"]),
             helper.make_node("Cast", ["m3"], ["mf"], to=TensorProto.FLOAT),
             helper.make_node("Sub", ["one", "mf"], ["inv"]),
             helper.make_node("Mul", ["inv", "big"], ["bias"]),
             helper.make_node("Add", ["scores", "bias"], ["y"])]
    m = model(nodes, {"mask": ((2, 8), TensorProto.INT64),
                      "scores": ((2, 4, 8, 8), TensorProto.FLOAT)}, ["y", "m2"],
              [init("a1", np.array([1], np.int64)), init("a2", np.array([2], np.int64)),
               init("one", np.float32(1)), init("big", np.float32(-1e4))])
    compiled = compile_model(m)
    ops = [k["op"] for k in compiled.inspect()["kernels"]]
    assert "Unsqueeze" not in ops and "Identity" not in ops, ops
    rng = np.random.default_rng(0)
    for seed in range(3):  # runs again over the same buffers
        mask = (rng.random((2, 8)) > 0.3).astype(np.int64)
        feeds = {"mask": mask, "scores": rng.normal(0, 1, (2, 4, 8, 8)).astype(np.float32)}
        got = compiled.run(feeds)
        y, m2 = run_ort(m, feeds)
        assert np.array_equal(got["y"], y) and np.array_equal(got["m2"], m2), seed
        assert got["m2"].dtype == np.int64 and got["m2"].shape == (2, 1, 1, 8)
