"""An int8 MatMul by 2-D constant weights on oneDNN's GEMM runs as a 1x1 convolution.

``MatMul(x[1, K], W[K, N])`` — a CNN's classifier after its pooling, a transformer's head on
the class token — multiplies one row by W. oneDNN 3.2's int8 matmul for it on AVX2 is the
GEMM-based ``gemm:jit``, which packs W on every call: at batch 1 that copy costs more than
the product (torchvision AlexNet quantize_static, ``[1, 9216]·[9216, 4096]``: 8.1 ms for
each half of the split weights, 75 % of the run). Its convolution reads the same weights
reordered once, at compile time, into its blocked layout: ``[1, 1280]·[1280, 1000]`` 0.59 →
0.23 ms with cold caches, 2 threads (benchmarks/, measured on a 2-core AMD EPYC, AVX2).

Rewrite: x is viewed as ``[1, K, 1, 1]`` (a Reshape, a view in the lowering), W becomes the
weights ``Wᵀ`` as ``[N, K, 1, 1]`` of a 1x1 Conv that writes ``[1, N, 1, 1]`` under a new
name, and a Reshape gives back the output's shape and name. The node keeps its name, chain
and composed attributes: its output channels are the same N values, per tensor or per
channel alike. Exact: the same integer products summed exactly, the same float32 chain.

More rows, ``MatMul(x[M, K], W[K, N])`` (a sequence model's rows: PP-OCRv4 rec's SVTR
layers and its CTC head ``[40, 120]·[120, 6625]``), are the pixels of a ``[1, K, 1, M]``
image, channels-last: a Reshape to ``[1, 1, M, K]`` and a Transpose to ``[1, K, 1, M]``, views
of x's bytes, and back on the other side. The AVX2 1x1 convolution took 0.53–0.86x the GEMM's
time (unsplit, 2 threads: ``[40, 120]·[120, 6625]`` 423 → 225 µs, ``[196, 384]·[384, 1536]``
0.93 → 0.71 ms, ``[3136, 96]·[96, 384]`` 1.12 → 0.79 ms), and without VNNI its weights stay
exact with pair-safe weights where the matmul needs both halves (compiler/lower/no_vnni.py).
Many rows only on AVX2 (``rows_measured``): AVX-512 without VNNI also runs the GEMM, unmeasured.

Only where oneDNN's int8 matmul for the shape is that GEMM (``gemm_packs_weights`` probes the
implementation oneDNN picks on this machine); where it picks another (oneDNN 3.2's brgemm
matmuls for VNNI / AMX take their weights in a layout chosen at creation), the MatMul stays.
Not applied: fewer than ``MIN_WEIGHTS`` weights (``[1, 256]·[256, 256]`` runs as fast either
way with cold caches: the copy is cheap, and without VNNI the split convolution on a 1x1 image
is three kernels where the matmul is two; ``[1, 512]·[512, 1000]``, ResNet-18's classifier,
0.36 → 0.23 ms; one row only), weights that are not a 2-D s8 constant or have a zero
point (oneDNN's convolution takes neither u8 weights nor weight zero points), chains
reading a tensor of another shape than the output's or one value, float MatMuls. Dynamic
quantization's MatMulInteger (quantize_dynamic) is taken with its run-time src zero point
and per-tensor scale product (one value each, at the ports they had: the convolution reads
its zero point from ``Fused.src_zero_point_port`` as the matmul did): BERT-like encoder
quantize_dynamic 0.76x, bit-identical (per-column weight scales make the product a vector:
declined). A tensor of the output's shape the chain reads (a transformer's
residual sum after its attention projection and its second FFN MatMul, a binary operand) is
viewed as the output is, ``[1, N, 1, M]`` channels-last: the same bytes at the same port.
On one pixel (one row) oneDNN's AVX2 jit convolution takes a binary operand only in the
dst's channels-last strides, src and dst in them too (measured: any of the three in ``abcd``
strides, ``ref:any``); the low half of split weights is laid out so (no_vnni ``_lo_layout``).
An unrolled LSTM cell's input projection ``[1, 4096]·[4096, 400]`` plus the recurrent one
(a CRNN, captcha-whisperer): 0.53x the run, LeViT's distillation head adding the class
head's output.
Composer option ``vector_matmul_as_conv`` (on by default).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math

import numpy as np

from qfuse.ir import DType, Graph, Node, Op, TensorInfo
from qfuse.ir.ops import ConvAttrs, ReshapeAttrs, TransposeAttrs
from qfuse.passes.base import PassContext, rewrite_where
from qfuse.passes.replace import replace_nodes
from qfuse.runtime.onednn import (
    CpuIsa,
    DataType,
    DnnlError,
    FormatTag,
    MemoryDesc,
    effective_cpu_isa,
    matmul,
)

log = logging.getLogger(__name__)

MIN_WEIGHTS = 1 << 16  # K·N from which the convolution is measurably faster (docstring)


def run(graph: Graph, ctx: PassContext) -> int:
    if not ctx.composer.on("vector_matmul_as_conv"):
        return 0
    return rewrite_where(graph, ctx, Op.MATMUL, _applies, _rewrite)


@functools.cache
def gemm_packs_weights(k: int, n: int, rows: int = 1) -> bool:
    """Does oneDNN run a u8 ``[rows, k]``·s8 ``[k, n]`` matmul on its GEMM kernels
    (``gemm:jit``, which pack the weights on every call), on this machine?"""
    def any_md(dims: tuple[int, int], dtype: DataType) -> MemoryDesc:
        return MemoryDesc.from_tag(dims, dtype, FormatTag.any)

    try:
        pd = matmul(any_md((rows, k), DataType.u8), any_md((k, n), DataType.s8),
                    any_md((rows, n), DataType.f32))
    except DnnlError:
        return False
    return pd.impl_name.startswith("gemm:")


def rows_measured() -> bool:
    """Many rows only where the convolution was measured faster than the GEMM: oneDNN's AVX2
    kernels (an AVX-512 CPU without VNNI also runs the GEMM; its kernels were not measured)."""
    return effective_cpu_isa() is CpuIsa.avx2


def _applies(graph: Graph, node: Node) -> bool:
    fused = node.fused
    src, out = graph.info(node.inputs[0]), graph.info(node.outputs[0])
    weights = graph.constant(node.inputs[1])
    rows = math.prod(out.shape[:-1])
    return (fused is not None and src.dtype.is_quantized and rows >= 1
            and src.shape[-1] * rows == math.prod(src.shape) and weights is not None
            and weights.ndim == 2 and weights.dtype == np.int8 and fused.wei_zero_point == 0
            and (weights.size >= MIN_WEIGHTS if rows == 1 else rows_measured())
            and gemm_packs_weights(*weights.shape, rows=rows)
            and all(graph.info(v).shape == out.shape or _one_value(graph, v)
                    for v in node.inputs[2:])
            and (out.quant is None or out.quant.axis is None))


def _one_value(graph: Graph, value: str) -> bool:
    """A run-time value of one element (dynamic quantization's src zero point and scale
    product, a scalar the chain multiplies by): read as it is, whatever the layout."""
    return math.prod(graph.info(value).shape) == 1


def _rewrite(graph: Graph, node: Node) -> None:
    x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
    out = graph.info(y)
    k, n = graph.constant(w).shape  # type: ignore[union-attr]
    rows = math.prod(out.shape[:-1])
    name, origin = node.name, list(node.origin)

    def view(value: str, info: TensorInfo, attrs: ReshapeAttrs | TransposeAttrs,
             result: str | None = None) -> str:
        """A Reshape or Transpose of ``value`` (bytes unchanged); every new value's name has
        ``@image`` (test_lower_no_vnni's ISA comparison expects only these to differ)."""
        shape = (attrs.shape if isinstance(attrs, ReshapeAttrs)
                 else tuple(graph.info(value).shape[p] for p in attrs.perm))
        op = Op.RESHAPE if isinstance(attrs, ReshapeAttrs) else Op.TRANSPOSE
        outputs = [result or graph.unique_name(f"{value}@image")]
        return graph.add_node(op, [value], outputs, attrs,
                              name=graph.unique_name(f"{name}/{op.value.lower()}"),
                              infos=[TensorInfo(shape, info.dtype, info.quant)],
                              origin=origin).outputs[0]

    def as_image(value: str, channels: int) -> str:
        """``value`` (rows x channels) as ``[1, channels, 1, rows]``: for many rows, the
        pixels of a 1 x rows image, channels-last: the same bytes."""
        info = graph.info(value)
        if rows == 1:
            return view(value, info, ReshapeAttrs((1, channels, 1, 1)))
        return view(view(value, info, ReshapeAttrs((1, 1, rows, channels))), info,
                    TransposeAttrs((0, 3, 1, 2)))

    image = as_image(x, k)
    # the run-time src zero point and scale (one value each) as they are; the chain's
    # residual or operand of the output's shape viewed like the output
    operands = [v if _one_value(graph, v) else as_image(v, n) for v in node.inputs[2:]]
    weights = np.ascontiguousarray(graph.constant(w).T.reshape(n, k, 1, 1))  # type: ignore
    w_conv = graph.add_constant(graph.unique_name(f"{w}@conv"), weights,
                                TensorInfo((n, k, 1, 1), DType.S8, graph.info(w).quant)).name
    fused = dataclasses.replace(node.fused, notes=[  # type: ignore[arg-type]
        *node.fused.notes,  # type: ignore[union-attr]
        f"{rows} row(s): a 1x1 convolution on [1, {k}, 1, {rows}] (weights reordered once; "
        "oneDNN's GEMM matmul packs them on every call)"])
    meta = dict(node.meta)
    conv_out = graph.unique_name(f"{y}@image")

    def build() -> None:
        conv = graph.add_node(Op.CONV, [image, w_conv, *operands], [conv_out],
                              ConvAttrs((1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1), name=name,
                              infos=[TensorInfo((1, n, 1, rows), out.dtype, out.quant)],
                              origin=origin)
        conv.fused, conv.meta = fused, meta
        pixels = conv_out if rows == 1 else view(conv_out, out, TransposeAttrs((0, 2, 3, 1)))
        view(pixels, out, ReshapeAttrs(tuple(out.shape)), result=y)

    replace_nodes(graph, [node], build)
    log.debug("%s: [%d, %d]·[%d, %d] as a 1x1 convolution", name, rows, k, k, n)
