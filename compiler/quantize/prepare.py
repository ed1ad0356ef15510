"""Float-model preparation before placement: constants as initializers, BatchNorm folded.

Exporters such as paddle2onnx write weights as ``Constant`` nodes; ``constants_to_initializers``
moves every Constant of the default domain (``value`` or ``value_float(s)`` / ``value_int(s)``)
into the initializers, so weights, biases and BN parameters are found as initializers.

BatchNormalization is folded into the conv before it.

The compiler folds BN only into float weights (passes/fold_batchnorm.py: quantized weights are
not rescaled), so the quantizer folds first and quantizes the folded weights — the order ONNX
Runtime's quant_pre_process uses too. Per output channel o, ``s[o] = γ[o] / √(var[o] + ε)``::

    w'[o] = w[o]·s[o],   b'[o] = (b[o] - mean[o])·s[o] + β[o]

(ONNX BatchNormalization, inference mode). ConvTranspose weights [Cin, Cout/g, k...] hold
output channel ``gi·Cout/g + j`` at group block gi of axis 0 and j of axis 1. Computed in
float64, stored float32. The conv then writes the BN's output name; the BN is removed.
Preconditions (else the BN stays): the conv output has no other reader and is no graph
output; weights, bias and the four BN inputs are initializers.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper


def constants_to_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    moved = []
    for node in g.node:
        if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or not node.attribute:
            continue
        attr = node.attribute[0]
        if attr.name == "value":
            value = numpy_helper.to_array(attr.t)
        elif attr.name in ("value_float", "value_floats"):
            value = np.asarray(onnx.helper.get_attribute_value(attr), np.float32)
        elif attr.name in ("value_int", "value_ints"):
            value = np.asarray(onnx.helper.get_attribute_value(attr), np.int64)
        else:  # sparse tensors, strings: left as they are
            continue
        g.initializer.append(numpy_helper.from_array(value, node.output[0]))
        moved.append(node)
    for node in moved:
        g.node.remove(node)
    return out


def fold_batchnorm(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    inits = {t.name: t for t in g.initializer}
    readers: dict[str, int] = {}
    for n in g.node:
        for v in n.input:
            readers[v] = readers.get(v, 0) + 1
    producer = {o: n for n in g.node for o in n.output}
    outputs = {o.name for o in g.output}
    removed = []
    for bn in g.node:
        if bn.op_type != "BatchNormalization" or len(bn.output) != 1:
            continue
        conv = producer.get(bn.input[0])
        if (conv is None or conv.op_type not in ("Conv", "ConvTranspose")
                or readers.get(bn.input[0]) != 1 or bn.input[0] in outputs
                or not all(v in inits for v in list(bn.input[1:5]) + list(conv.input[1:]))):
            continue
        gamma, beta, mean, var = (numpy_helper.to_array(inits[v]).astype(np.float64)
                                  for v in bn.input[1:5])
        eps = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
        s = gamma / np.sqrt(var + eps)
        w = numpy_helper.to_array(inits[conv.input[1]]).astype(np.float64)
        if conv.op_type == "Conv":
            w = w * s.reshape([-1] + [1] * (w.ndim - 1))
        else:
            group = next((a.i for a in conv.attribute if a.name == "group"), 1)
            blocks = w.reshape(group, w.shape[0] // group, w.shape[1], *w.shape[2:])
            blocks = blocks * s.reshape(group, 1, w.shape[1], *([1] * (w.ndim - 2)))
            w = blocks.reshape(w.shape)
        b = (numpy_helper.to_array(inits[conv.input[2]]).astype(np.float64)
             if len(conv.input) > 2 and conv.input[2] else np.zeros_like(s))
        b = (b - mean) * s + beta
        w_name, b_name = f"{conv.input[1]}_bn_folded", f"{bn.output[0]}_bias_bn_folded"
        g.initializer.append(numpy_helper.from_array(w.astype(np.float32), w_name))
        g.initializer.append(numpy_helper.from_array(b.astype(np.float32), b_name))
        conv.input[1] = w_name
        if len(conv.input) > 2:
            conv.input[2] = b_name
        else:
            conv.input.append(b_name)
        conv.output[0] = bn.output[0]
        removed.append(bn)
    for bn in removed:
        g.node.remove(bn)
    used = {v for n in g.node for v in n.input} | {i.name for i in g.input}
    keep = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(keep)
    return out


__all__ = ["constants_to_initializers", "fold_batchnorm"]
