"""A BatchNormalization that could not fold into a float conv becomes Mul + Add per channel,
when a Conv / ConvTranspose / MatMul / Gemm produces its input: the compute node then takes it
into its post-op chain (weight scales and bias, or per-channel post-ops) instead of it running
as a kernel of its own (OpenVINO's BatchNormDecomposition does the same before its fusions).

Identity, per channel c (dim 1), with ``a[c] = γ[c] / √(var[c] + ε)`` and
``b[c] = β[c] − mean[c]·a[c]`` (computed in float64, stored as float32):

    BN(x)[c] = (x − mean[c])·a[c] + β[c] = x·a[c] + b[c]

Where this happens: NNCF leaves a BatchNormalization after an int8 convolution (its quantizer
sits after the BN), and fold_batchnorm does not rescale quantized weights.

Not bit-exact: the reference BatchNormalization computes in float64 and rounds once; x·a then
+ b round twice in float32 — a few ulps apart, which a following quantize turns into at most
one step at near-ties (tests/passes/test_decompose_batchnorm.py measures it).

Precondition (else the BN stays, reason recorded): scale, bias, mean and var are constants
(or DequantizeLinear of constants: quantize_static quantizes a standalone BN's scale and bias
as weights); and either the input is produced by a Conv, ConvTranspose, MatMul or Gemm, or by
the QuantizeLinear / DequantizeLinear pair of one (NNCF quantizes a depthwise conv's output
before its BN: the chain continues through the pair, its quantize kept as post-ops), or the
output reaches a quantizer through single-reader activations (DenseNet's pre-activation
``[DQ →] BN → Relu → Q``, quantize_static's and NNCF's: the Mul then starts a gate chain,
passes/fuse_post_ops.py, one binary primitive for the dequantize, the BN, the Relu and the
quantize, with the same float32 operations as the batch normalization kernel: x·a, + b).
Otherwise a standalone BatchNorm stays one oneDNN batch normalization kernel rather than two
binary kernels. The Add writes the BN's output value (names survive).
"""

from __future__ import annotations

import logging

import numpy as np

from qfuse.ir import Graph, Node, Op
from qfuse.ir.postops import single_pixel_batch
from qfuse.passes.base import PassContext, rewrite_each
from qfuse.passes.matmul_reshape import SHAPE_OPS
from qfuse.passes.post_op_match import activation, constant_operand, sole_reader
from qfuse.passes.replace import replace_nodes

log = logging.getLogger(__name__)

COMPUTE = (Op.CONV, Op.CONV_TRANSPOSE, Op.MATMUL, Op.GEMM)
QUANTIZERS = (Op.QUANTIZE_LINEAR, Op.FAKE_QUANTIZE)


def run(graph: Graph, ctx: PassContext) -> int:
    return rewrite_each(graph, ctx, Op.BATCH_NORM, _check, _decompose)


def _check(graph: Graph, bn: Node) -> str | None:
    for port, what in enumerate(("scale", "bias", "mean", "var"), 1):
        if constant_operand(graph, bn.inputs[port])[0] is None:
            return f"BatchNorm {what} '{bn.inputs[port]}' is not a constant"
    producer = _before_reshapes(graph, bn)
    if _after_quantized_compute(graph, producer) or _quantized_after(graph, bn):
        return None
    if producer is None or producer.op not in COMPUTE:
        return ("a standalone BatchNorm (its input is not a Conv / MatMul output, its output "
                "is not quantized) stays one batch normalization kernel")
    return None


def _quantized_after(graph: Graph, bn: Node) -> bool:
    """The BN's output reaches a quantizer through single-reader activations (DenseNet's
    pre-activation ``BN → Relu → Q``): the Mul starts a chain that ends in that quantize
    (fuse_gate_chain), one kernel for the BN, the activations and the quantize."""
    info = graph.info(bn.outputs[0])
    if info.rank < 2 or single_pixel_batch(info.shape):
        return False
    value = bn.outputs[0]
    while True:
        reader, _ = sole_reader(graph, value)
        if reader is None:
            return False
        if reader.op in QUANTIZERS:
            return True
        if not _keeps_channels_last(graph, bn, reader) and activation(reader) is None:
            return False  # not one the gate chain takes as a post-op
        value = reader.outputs[0]


def _keeps_channels_last(graph: Graph, bn: Node, node: Node) -> bool:
    """``node`` only regroups the leading dims of a 2-D BatchNorm's [rows, C] values (LeViT
    normalizes a Linear's [B·N, C] output: Flatten before, Reshape to [B, N, C] after), so a
    per-channel Mul / Add stays per last dim across it."""
    channels = graph.info(bn.inputs[0]).shape
    if len(channels) != 2 or node.op not in SHAPE_OPS:
        return False
    before, after = graph.info(node.inputs[0]).shape, graph.info(node.outputs[0]).shape
    return bool(before) and bool(after) and before[-1] == after[-1] == channels[-1]


def _before_reshapes(graph: Graph, bn: Node) -> Node | None:
    """The producer of the BN's input, past single-reader ``_keeps_channels_last`` nodes."""
    producer = graph.producer(bn.inputs[0])
    while (producer is not None and _keeps_channels_last(graph, bn, producer)
           and graph.uses(producer.outputs[0]) == 1):
        producer = graph.producer(producer.inputs[0])
    return producer


def _after_quantized_compute(graph: Graph, producer: Node | None) -> bool:
    """``producer`` is the DequantizeLinear of a compute node's QuantizeLinear, each read only
    by the next (NNCF quantizes a depthwise conv's output before its BatchNorm): the conv's
    chain continues through the pair (fuse_post_ops) and takes the Mul + Add too."""
    if producer is None or producer.op is not Op.DEQUANTIZE_LINEAR:
        return False
    q = graph.producer(producer.inputs[0])
    if q is None or q.op is not Op.QUANTIZE_LINEAR or graph.uses(q.outputs[0]) != 1:
        return False
    compute = graph.producer(q.inputs[0])
    return (compute is not None and compute.op in COMPUTE
            and graph.uses(compute.outputs[0]) == 1
            and graph.uses(producer.outputs[0]) == 1)


def _decompose(graph: Graph, bn: Node) -> None:
    gamma, beta, mean, var = (np.asarray(constant_operand(graph, name)[0], np.float64)
                              for name in bn.inputs[1:5])
    a = gamma / np.sqrt(var + bn.attrs.epsilon)
    b = beta - mean * a
    x, y = bn.inputs[0], bn.outputs[0]
    info = graph.info(y)
    shape = (-1,) + (1,) * (info.rank - 2)
    a_name = graph.add_constant(graph.unique_name(f"{bn.name}/scale"),
                                a.reshape(shape).astype(np.float32)).name
    b_name = graph.add_constant(graph.unique_name(f"{bn.name}/shift"),
                                b.reshape(shape).astype(np.float32)).name

    def build() -> None:
        t = graph.unique_name(f"{y}/scaled")
        graph.add_node(Op.MUL, [x, a_name], [t], name=f"{bn.name}/mul", infos=[info],
                       origin=bn.origin)
        graph.add_node(Op.ADD, [t, b_name], [y], name=bn.name, infos=[info], origin=bn.origin)

    replace_nodes(graph, [bn], build)
    log.debug("decomposed %s into Mul + Add per channel", bn)
