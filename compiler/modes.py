"""What each compile mode runs before lowering (docs/design.md, "Modes").

- ``fused``: the full pipeline (compiler/pipeline.py), then the fused lowering.
- ``unfused``: the same pipeline but table_lookup (a chain of ops as one table is fusion);
  the lowering runs every post-op of a fused node as its own oneDNN primitive
  (compiler/lower/unfused.py).
- ``fp32``: quantization stripped (passes/strip_quantization.py; what it leaves int8, a
  dynamically quantized node's weights beyond s8 split by weight_zero_point), the import
  cleanup, every float Conv / ConvTranspose / MatMul marked as a fused node with an empty
  chain, then fuse_bias, fuse_post_ops and compose_post_ops on the float graph: f32
  primitives with fused eltwise / sum post-ops.

The graph is verified after every pass; the pass results (with their decline reasons) are
returned for `inspect`'s not_fused list.
"""

from __future__ import annotations

import dataclasses
import logging

from qfuse.compiler.pipeline import PIPELINE, run_pipeline
from qfuse.ir import Graph
from qfuse.ir.mode import Mode
from qfuse.passes import strip_quantization
from qfuse.passes.base import PassContext, PassResult, run_pass

log = logging.getLogger(__name__)

FP32_CLEANUP = ("drop_identity", "constant_fold", "merge_duplicates", "fold_batchnorm",
                "gemm_to_matmul", "canonicalize_arith", "whole_sample_norm")
FP32_FUSION = ("fuse_bias", "fuse_post_ops", "compose_post_ops", "deconv_as_depth_to_space",
               "flatten_matmul_rows", "strided_pointwise_conv", "merge_split_concat")


def run_passes(graph: Graph, mode: Mode | str, ctx: PassContext | None = None) -> list[PassResult]:
    """Rewrite ``graph`` in place for ``mode``; the results of the passes that ran."""
    ctx = ctx or PassContext()
    if mode == Mode.UNFUSED:  # on a copy: the caller's context keeps its own settings
        ctx = dataclasses.replace(ctx, disabled_passes=ctx.disabled_passes | {"table_lookup"})
    if mode in (Mode.FUSED, Mode.UNFUSED):
        return run_pipeline(graph, ctx)
    if mode != Mode.FP32:
        raise ValueError(f"mode {mode!r} runs no passes")
    passes_by_name = dict(PIPELINE)
    results = [_run(graph, ctx, "strip_quantization", strip_quantization.run)]
    # a dynamically quantized node strip_quantization leaves int8 (its int32 accumulator read
    # as it is) with weights beyond s8: split as in the int8 modes
    results.append(_run(graph, ctx, "weight_zero_point", passes_by_name["weight_zero_point"]))
    for name in FP32_CLEANUP:
        if name not in ctx.disabled_passes:
            results.append(_run(graph, ctx, name, passes_by_name[name]))
    results.append(_run(graph, ctx, "mark_float_compute", strip_quantization.mark_float_compute))
    for name in FP32_FUSION:
        if name not in ctx.disabled_passes:
            results.append(_run(graph, ctx, name, passes_by_name[name]))
    return results


def _run(graph: Graph, ctx: PassContext, name: str, fn: object) -> PassResult:
    result = run_pass(name, fn, graph, ctx)  # type: ignore[arg-type]
    graph.verify()
    return result
