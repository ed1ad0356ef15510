"""Fold an inference BatchNormalization into the float Conv / ConvTranspose that feeds it.

Identity, per output channel o, with ``s[o] = γ[o] / √(var[o] + ε)``:

    BN(conv(x, w, b))[o] = (Σ x·w[o] + b[o] - mean[o])·s[o] + β[o]
                         = Σ x·(w[o]·s[o]) + ((b[o] - mean[o])·s[o] + β[o])
    so  w' = w·s  along the output-channel axis,  b' = (b - mean)·s + β  (b = 0 if absent).

The output-channel axis of the weights is 0 for Conv ([Cout, Cin/g, k...]); for ConvTranspose
([Cin, Cout/g, k...]) output channel ``o = gi·Cout/g + j`` sits at group block gi of axis 0
and position j of axis 1. s, w' and b' are computed in float64 and stored as float32.

Not bit-exact: the unfolded graph rounds the conv output to float32 before the BN; the folded
one rounds w' and b' to float32 instead, so the two sums differ by float32 reassociation
(tests/passes/test_fold_batchnorm.py measures and bounds the difference).

Precondition (else the BN stays, the reference still evaluates it, and the reason is
recorded): the BN input is the output of a Conv / ConvTranspose read by nothing else (not a
graph output either); γ, β, mean and var are constants; the conv weights are a plain float32
constant — not a DequantizeLinear of an integer weight, whose integers and scales the
quantization passes need as they are — and the conv bias, if any, is a float32 constant.

The folded conv keeps the conv's name and writes the BN's output value (names survive).
"""

from __future__ import annotations

import logging

import numpy as np

from qfuse.ir import DType, Graph, Node, Op
from qfuse.passes.base import PassContext, rewrite_each
from qfuse.passes.replace import replace_nodes

log = logging.getLogger(__name__)

CONVS = (Op.CONV, Op.CONV_TRANSPOSE)
NOT_A_CONV = "input is not a single-consumer Conv"


def run(graph: Graph, ctx: PassContext) -> int:
    return rewrite_each(graph, ctx, Op.BATCH_NORM, _check, _fold)


def _check(graph: Graph, bn: Node) -> str | None:
    conv = graph.producer(bn.inputs[0])
    if conv is None or conv.op not in CONVS or conv.fused is not None:
        return NOT_A_CONV
    readers = graph.uses(bn.inputs[0])
    if readers != 1:
        return f"{NOT_A_CONV}: its output '{bn.inputs[0]}' has {readers} readers"
    for port, what in enumerate(("scale", "bias", "mean", "var"), 1):
        if graph.constant(bn.inputs[port]) is None:
            return f"BatchNorm {what} '{bn.inputs[port]}' is not a constant"
    weights = conv.inputs[1]
    if graph.constant(weights) is None:
        producer = graph.producer(weights)
        if producer is not None and producer.op is Op.DEQUANTIZE_LINEAR:
            return (f"conv weights '{weights}' are a DequantizeLinear of an integer tensor; "
                    "quantized weights are not rescaled")
        return f"conv weights '{weights}' are not a constant"
    if graph.info(weights).dtype is not DType.F32:
        return f"conv weights '{weights}' are {graph.info(weights).dtype.name}, not F32"
    bias = _bias(conv)
    if bias and (graph.constant(bias) is None or graph.info(bias).dtype is not DType.F32):
        return f"conv bias '{bias}' is not a float32 constant"
    return None


def _bias(conv: Node) -> str:
    return conv.inputs[2] if len(conv.inputs) > 2 else ""


def _fold(graph: Graph, bn: Node) -> None:
    conv = graph.producer(bn.inputs[0])
    assert conv is not None
    gamma, beta, mean, var = (graph.constant(name).astype(np.float64) for name in bn.inputs[1:5])
    scale = gamma / np.sqrt(var + bn.attrs.epsilon)
    weights = graph.constant(conv.inputs[1]).astype(np.float64)
    new_w = _scale_output_channels(conv, weights, scale).astype(np.float32)
    bias = _bias(conv)
    old_b = graph.constant(bias).astype(np.float64) if bias else np.zeros_like(mean)
    new_b = ((old_b - mean) * scale + beta).astype(np.float32)
    y, info = bn.outputs[0], graph.info(bn.outputs[0])
    w_name = graph.add_constant(graph.unique_name(f"{conv.inputs[1]}_bn"), new_w).name
    b_name = graph.add_constant(graph.unique_name(f"{bias or conv.name + '_bias'}_bn"),
                                new_b).name

    def build() -> None:
        graph.add_node(conv.op, [conv.inputs[0], w_name, b_name], [y], conv.attrs,
                       name=conv.name, infos=[info], origin=[*conv.origin, *bn.origin])

    replace_nodes(graph, [conv, bn], build)
    log.debug("folded %s into %s", bn, conv)


def _scale_output_channels(conv: Node, weights: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``weights`` times ``scale[o]`` along the output channels (module docstring)."""
    kernel = (1,) * (weights.ndim - 2)
    if conv.op is Op.CONV:
        return weights * scale.reshape((-1, 1, *kernel))
    groups = conv.attrs.group
    cin, per_group = weights.shape[:2]
    grouped = weights.reshape((groups, cin // groups, per_group, *weights.shape[2:]))
    grouped = grouped * scale.reshape((groups, 1, per_group, *kernel))
    return grouped.reshape(weights.shape)
