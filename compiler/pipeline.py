"""The one ordered list of passes (DESIGN.md "Passes"), and the function that runs it."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable

from ir import Graph
from passes.base import PassContext, PassFn, PassResult, run_pass

log = logging.getLogger(__name__)

# (name, module under passes/ exposing ``run(graph, ctx) -> int``), in order.
PIPELINE: list[tuple[str, str]] = [
    # 1. import cleanup
    ("drop_identity", "passes.drop_identity"),
    ("constant_fold", "passes.constant_fold"),
    ("fold_batchnorm", "passes.fold_batchnorm"),
    ("gemm_to_matmul", "passes.gemm_to_matmul"),
    ("canonicalize_arith", "passes.canonicalize_arith"),
    # 2-3. quantization into FakeQuantize, then quantize-only FakeQuantize + dequantize
    ("qdq_to_fake_quantize", "passes.qdq_to_fake_quantize"),
    ("decompose_fake_quantize", "passes.decompose_fake_quantize"),
    ("fold_weight_quantize", "passes.fold_weight_quantize"),
    # 4. dequantize moved through precision-preserving ops and after compute ops
    ("propagate_dequantize", "passes.propagate_dequantize"),
    ("move_dequantize", "passes.move_dequantize"),
    ("eliminate_requantize", "passes.eliminate_requantize"),
    # 5-6. bias and post-op fusion
    ("fuse_bias", "passes.fuse_bias"),
    ("fuse_post_ops", "passes.fuse_post_ops"),
    # Softmax / LayerNorm reading and writing int8; u8 matmul weights written as s8
    ("fuse_quantized_norm", "passes.fuse_quantized_norm"),
    ("signed_matmul_weights", "passes.signed_matmul_weights"),
    # 7. the composer's mapping, recorded on each fused node
    ("compose_post_ops", "passes.compose_post_ops"),
]


def pass_function(module: str) -> PassFn:
    return importlib.import_module(module).run


def run_pipeline(
    graph: Graph,
    ctx: PassContext | None = None,
    *,
    until: str | None = None,
    after_each: Callable[[str, Graph], None] | None = None,
) -> list[PassResult]:
    """Run the passes in order on ``graph`` (in place); stop after ``until`` if given.

    ``after_each(name, graph)`` is called after every pass (tests compare the reference
    interpreter's outputs there). The graph is verified after every pass.
    """
    ctx = ctx or PassContext()
    results = []
    for name, module in PIPELINE:
        if name in ctx.disabled_passes:
            continue
        results.append(run_pass(name, pass_function(module), graph, ctx))
        graph.verify()
        if after_each is not None:
            after_each(name, graph)
        if name == until:
            break
    return results
