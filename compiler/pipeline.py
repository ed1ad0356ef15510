"""The one ordered list of passes (docs/design.md, "Passes"), and the function that runs it."""

from __future__ import annotations

import logging
from collections.abc import Callable

from qfuse.ir import Graph
from qfuse.passes import (
    canonicalize_arith,
    compose_post_ops,
    constant_fold,
    decompose_batchnorm,
    decompose_fake_quantize,
    deconv_as_depth_to_space,
    distribute_concat,
    drop_identity,
    eliminate_requantize,
    fold_batchnorm,
    fold_weight_quantize,
    fold_weight_views,
    fuse_bias,
    fuse_gated_activation,
    fuse_post_ops,
    flatten_matmul_rows,
    fold_pad,
    fold_resize_dequantize,
    fuse_quantized_norm,
    gemm_to_matmul,
    merge_duplicates,
    merge_split_concat,
    move_dequantize,
    pair_channels,
    patch_conv,
    propagate_dequantize,
    qdq_to_fake_quantize,
    quantize_before_reshape,
    signed_matmul_weights,
    strided_pointwise_conv,
    strip_quantization,
    table_lookup,
    vector_matmul_as_conv,
    whole_sample_norm,
    weight_zero_point,
    wide_conv,
    widen_gate,
)
from qfuse.passes.base import PassContext, PassFn, PassResult, run_pass

log = logging.getLogger(__name__)

# (name, the pass's ``run(graph, ctx) -> int``), in order.
PIPELINE: list[tuple[str, PassFn]] = [
    # 1. import cleanup
    ("drop_identity", drop_identity.run),
    ("constant_fold", constant_fold.run),
    # values computed from constants through quantization and compute ops: NNCF's quantized
    # attention-bias tables and their Gathers, quantized constant tables and their products
    # where quant_pre_process did not fold them first
    ("fold_constant_cones", constant_fold.run_constant_cones),
    ("merge_duplicates", merge_duplicates.run),
    # elementwise ops after a Concat, up to a quantize, run on each input (MixNet's batch
    # norm and activation after its mixed convolutions): each joins its producer's chain
    ("distribute_concat", distribute_concat.run),
    ("fold_batchnorm", fold_batchnorm.run),
    ("decompose_batchnorm", decompose_batchnorm.run),
    ("gemm_to_matmul", gemm_to_matmul.run),
    ("canonicalize_arith", canonicalize_arith.run),
    # GroupNorm(1): the norm of a Reshape to one row per sample as the norm of the sample
    ("whole_sample_norm", whole_sample_norm.run),
    # an 8-bit tensor's elementwise chain with an island (quantize_static's GELU), up to a
    # quantize, as a table of its 256 values
    ("table_lookup", table_lookup.run),
    # 2-3. quantization into FakeQuantize, then quantize-only FakeQuantize + dequantize
    ("qdq_to_fake_quantize", qdq_to_fake_quantize.run),
    ("decompose_fake_quantize", decompose_fake_quantize.run),
    ("fold_weight_quantize", fold_weight_quantize.run),
    # a Transpose / Reshape of a dequantized weight (torch.onnx's quantized Linear) as the
    # dequantize of the viewed integers, which the MatMul then reads as int8 weights
    ("fold_weight_views", fold_weight_views.run),
    ("quantize_before_reshape", quantize_before_reshape.run),
    # x·sigmoid(x), x·hardsigmoid(x), x·relu6(x + 3)/6 as one activation the producer absorbs
    ("fuse_gated_activation", fuse_gated_activation.run),
    # 4. dequantize moved through precision-preserving ops and after compute ops
    ("propagate_dequantize", propagate_dequantize.run),
    ("fold_pad", fold_pad.run),
    ("weight_zero_point", weight_zero_point.run),
    ("move_dequantize", move_dequantize.run),
    ("eliminate_requantize", eliminate_requantize.run),
    # a requantize after an enlarging nearest Resize (into a Concat's scale) runs before it,
    # on the smaller map, and the Resize moves bytes
    ("requantize_before_resize", quantize_before_reshape.run_requantize),
    # a Conv / MatMul left in float32 (NNCF's squeeze-excitation convs, attention's float
    # products): a fused node with an empty chain, so its activations and adds join it
    ("mark_float_compute", strip_quantization.mark_float_compute),
    # 5-6. bias and post-op fusion
    ("fuse_bias", fuse_bias.run),
    ("fuse_post_ops", fuse_post_ops.run),
    # x·Q(act(x)) with the gate's quantizer kept: one binary primitive with post-ops
    ("fuse_gate_chain", fuse_post_ops.run_gates),
    # a dequantize after views of a compute node's 8-bit output, read only in float32
    ("fold_view_dequantize", fuse_post_ops.run_view_dequantize),
    # Softmax / LayerNorm reading and writing int8; u8 matmul weights written as s8
    ("fuse_quantized_norm", fuse_quantized_norm.run),
    ("signed_matmul_weights", signed_matmul_weights.run),
    # a dequantize still standing after an int8 nearest Resize: the Resize writes float32
    ("fold_resize_dequantize", fold_resize_dequantize.run),
    # a quantize whose integers only its dequantize reads, read by float ops (NNCF's residual
    # stream): one float32 → float32 kernel instead of two
    ("fuse_fake_quantize", fuse_post_ops.run_fake_quantize),
    # a Concat of consecutive parts of one Split reads them as one slice (one copy)
    ("merge_split_concat", merge_split_concat.run),
    # no VNNI: channel orders in which fewer int16 pairs of input channels can saturate
    ("pair_channels", pair_channels.run),
    # 7. the composer's mapping, recorded on each fused node
    ("compose_post_ops", compose_post_ops.run),
    # a squeeze-excitation gate's Conv writes the gate repeated, in the rows its multiply
    # reads (a repeat kernel less, each multiply in long rows)
    ("widen_gate", widen_gate.run),
    # a ConvTranspose with kernel = stride and few output channels as a 1x1 Conv writing
    # b²·O channels and a DepthToSpace (oneDNN's deconvolution blocks output channels by 16)
    ("deconv_as_depth_to_space", deconv_as_depth_to_space.run),
    # a MatMul over the rows of a rank > 2 tensor as one 2-D matmul (views, no copies)
    ("flatten_matmul_rows", flatten_matmul_rows.run),
    # an int8 MatMul on oneDNN's GEMM (AVX2) as a 1x1 convolution over its rows: its weights
    # reordered once, where the GEMM packs them on every call
    ("vector_matmul_as_conv", vector_matmul_as_conv.run),
    # an int8 conv whose kernel tiles an image of few channels (a patch embedding) as a 1x1
    # conv over the patches: oneDNN's kernels for 3 input channels are slow
    ("patch_conv", patch_conv.run),
    # a 1x1 conv with strides reads a strided Slice (oneDNN's own copy for it goes wrong);
    # last, so the Slice changes no fusion decision (nodes are visited in topological order)
    ("strided_pointwise_conv", strided_pointwise_conv.run),
    # an int8 conv over an (H, 1) image as one over (1, H): oneDNN blocks the output width
    ("wide_conv", wide_conv.run),
]


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
    for name, fn in PIPELINE:
        if name in ctx.disabled_passes:
            continue
        results.append(run_pass(name, fn, graph, ctx))
        graph.verify()
        if after_each is not None:
            after_each(name, graph)
        if name == until:
            break
    return results
