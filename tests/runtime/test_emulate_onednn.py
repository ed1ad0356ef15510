"""``--emulate onednn`` against qfuse's own compiled fused model (oneDNN), tensor by tensor.

``CompiledModel.run_all`` exposes every value the fused plan materializes; the quantized
tensors it does not (outputs a fusion absorbed, MaxPool outputs written in another layout) are
skipped. The emulation models oneDNN's own int8 arithmetic — the dst zero point added before
the rounding, the graph input quantized by a reorder, rint(x·(1/s) + zp) — which qfuse compiles
with the composer option ``zero_point_before_round``; by default it rounds the ONNX way
instead (tests/compiler/test_onnx_rounding.py).

Exact (0 LSB, every materialized tensor) on every small zoo model. (vgg once differed by 1
LSB on near-ties when the fused pipeline rebuilt dst scales as (ih − il)/255, one float32 ulp
from the ONNX scale; quantize chain items now carry the model's own scale.)
"""

from __future__ import annotations

import numpy as np
import pytest

from qfuse.compiler.api import compile_model
from qfuse.examples import zoo
from qfuse.ir.postops import ComposerOptions
from qfuse.runtime.emulate import emulate, plan


@pytest.mark.parametrize("name", zoo.SMALL_ARCHITECTURES)
def test_onednn_emulation_matches_fused(name: str) -> None:
    path = zoo.model_path(name, quantized=True)
    fused = compile_model(path, mode="fused",
                          composer=ComposerOptions().with_("zero_point_before_round"))
    feeds = zoo.sample_inputs(path, 1, seed=5)[0]
    theirs = fused.run_all(feeds)
    decisions = plan(fused.graph, "onednn")
    ours = emulate(fused.graph, feeds, "onednn", decisions=decisions)
    compared = [d for d in decisions if d.tensor in theirs]
    # transformer: 9 of 31 (its K and V projections write s8 under new names,
    # passes/signed_matmul_weights.py; the other quantized tensors are absorbed by fusions)
    assert len(compared) >= len(decisions) // 4, "the fused plan materializes too few tensors"
    for d in compared:
        diff = np.abs(ours[d.tensor].astype(int) - theirs[d.tensor].astype(int))
        assert diff.max() == 0, f"{d.tensor} ({d.summary()}): {np.mean(diff > 0):.4%} differ"
