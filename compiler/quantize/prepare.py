"""Float-model preparation before placement: constants as initializers, identity arithmetic
dropped, BatchNorm folded.

Exporters such as paddle2onnx write weights as ``Constant`` nodes; ``constants_to_initializers``
moves every Constant of the default domain (``value`` or ``value_float(s)`` / ``value_int(s)``)
into the initializers, so weights, biases and BN parameters are found as initializers.

``drop_identity_arithmetic`` removes ``x·1``, ``x/1``, ``x + 0`` and ``x - 0`` by a one-element
constant (paddle2onnx writes SiLU as ``x·sigmoid(x·1)``): exact in float (IEEE 754: x·1 = x/1
= x, x + 0 = x - 0 = x, up to the sign of a zero), and the pattern left is the one the compiler
fuses (passes/fuse_gated_activation.py), where the extra Mul would stop the conv's post-op
chain at a tensor with two readers. A node whose output is a graph output stays.

``scale_after_matmul`` moves a scalar factor from a MatMul input to its output:
``MatMul(x·c, y) → MatMul(x, y)·c`` (also ``x/c``, either input), the attention's
``(q·d^-½)·kᵀ``. Equal in real arithmetic; in float32 the product is rounded once more or less
(a relative 2^-24 per element). Before the MatMul the factor is a float op between the int8
tensor it reads and the quantizer the MatMul needs, which no compiler pass fuses; after it the
factor is an output scale the MatMul absorbs as a post-op. Preconditions: the factor is a
one-element float constant and the scaled value's only reader is the MatMul.

``fold_bias_add`` folds ``Add(conv(x), b)`` with a constant b of one value per output channel
(shape ``[1, C, 1, ...]``, ``[C, 1, ...]`` or one element) into the conv's bias (paddle2onnx
writes ConvTranspose bias that way), so a BatchNormalization after it folds too (otherwise the
BN, its activation and the quantizer after it stay float ops the compiler does not fuse).
Exact up to the order of the two float additions (the bias is added to the same sum). Same
preconditions as the BN fold.

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


_IDENTITY = {"Mul": 1.0, "Div": 1.0, "Add": 0.0, "Sub": 0.0}


def drop_identity_arithmetic(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` without elementwise ops by a neutral one-element constant (module docstring)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    inits = {t.name: t for t in g.initializer}
    outputs = {o.name for o in g.output}
    rename: dict[str, str] = {}
    removed = []
    for node in g.node:
        for i, v in enumerate(node.input):
            node.input[i] = rename.get(v, v)
        neutral = _IDENTITY.get(node.op_type)
        if neutral is None or len(node.input) != 2 or node.output[0] in outputs:
            continue
        consts = [i for i, v in enumerate(node.input) if v in inits]
        if len(consts) != 1 or (node.op_type in ("Div", "Sub") and consts != [1]):
            continue
        c = numpy_helper.to_array(inits[node.input[consts[0]]])
        if c.size != 1 or c.ndim > 1 or not np.issubdtype(c.dtype, np.floating) \
                or float(c.reshape(())) != neutral:
            continue
        rename[node.output[0]] = node.input[1 - consts[0]]
        removed.append(node)
    for node in removed:
        g.node.remove(node)
    return out


def scale_after_matmul(model: onnx.ModelProto) -> onnx.ModelProto:
    """``MatMul(x·c, y)`` as ``MatMul(x, y)·c`` (module docstring)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    inits = {t.name: t for t in g.initializer}
    outputs = {o.name for o in g.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in g.node:
        for v in n.input:
            readers.setdefault(v, []).append(n)
    used = {v for n in g.node for v in list(n.input) + list(n.output)} | set(inits)
    moves: dict[int, onnx.NodeProto] = {}  # id(MatMul) -> the Mul / Div to put after it
    for node in g.node:
        if node.op_type not in ("Mul", "Div") or len(node.input) != 2:
            continue
        y = node.output[0]
        users = readers.get(y, [])
        if y in outputs or len(users) != 1 or users[0].op_type != "MatMul" \
                or id(users[0]) in moves or list(users[0].input).count(y) != 1:
            continue
        consts = [i for i, v in enumerate(node.input) if v in inits]
        if len(consts) != 1 or (node.op_type == "Div" and consts != [1]):
            continue
        c = numpy_helper.to_array(inits[node.input[consts[0]]])
        if c.size != 1 or c.ndim > 1 or not np.issubdtype(c.dtype, np.floating):
            continue
        moves[id(users[0])] = node
    if not moves:
        return out
    order = []
    moved = {id(n) for n in moves.values()}
    for node in g.node:
        if id(node) in moved:
            continue
        order.append(node)
        scale = moves.get(id(node))
        if scale is None:
            continue
        x = next(v for v in scale.input if v not in inits)
        c = next(v for v in scale.input if v in inits)
        for i, v in enumerate(node.input):
            if v == scale.output[0]:
                node.input[i] = x
        unscaled, k = f"{node.output[0]}_unscaled", 1
        while unscaled in used:
            unscaled, k = f"{node.output[0]}_unscaled_{k}", k + 1
        used.add(unscaled)
        after = onnx.helper.make_node(scale.op_type, [unscaled, c], [node.output[0]],
                                      scale.name)
        node.output[0] = unscaled
        order.append(after)
    del g.node[:]
    g.node.extend(order)
    return out


def _indexed_copy(model: onnx.ModelProto) -> tuple[
        onnx.ModelProto, dict[str, onnx.TensorProto], dict[str, int],
        dict[str, onnx.NodeProto], set[str]]:
    """A copy of ``model`` to rewrite, with its initializers by name, the number of readers of
    each value, each value's producer and the graph output names."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    readers: dict[str, int] = {}
    for n in g.node:
        for v in n.input:
            readers[v] = readers.get(v, 0) + 1
    return (out, {t.name: t for t in g.initializer}, readers,
            {o: n for n in g.node for o in n.output}, {o.name for o in g.output})


def _conv_bias(conv: onnx.NodeProto, inits: dict[str, onnx.TensorProto],
               channels: int) -> np.ndarray:
    """The conv's bias in float64 (zeros when it has none)."""
    if len(conv.input) > 2 and conv.input[2]:
        return numpy_helper.to_array(inits[conv.input[2]]).astype(np.float64)
    return np.zeros(channels)


def _set_conv_bias(g: onnx.GraphProto, inits: dict[str, onnx.TensorProto],
                   conv: onnx.NodeProto, bias: np.ndarray, name: str) -> None:
    """A new float32 initializer ``name`` holding ``bias`` as the conv's bias input."""
    g.initializer.append(numpy_helper.from_array(bias.astype(np.float32), name))
    inits[name] = g.initializer[-1]
    if len(conv.input) > 2:
        conv.input[2] = name
    else:
        conv.input.append(name)


def fold_bias_add(model: onnx.ModelProto) -> onnx.ModelProto:
    """``Add(conv(x), b)`` with a per-output-channel constant b as the conv's bias."""
    out, inits, readers, producer, outputs = _indexed_copy(model)
    g = out.graph
    removed = []
    for add in g.node:
        if add.op_type != "Add" or len(add.input) != 2:
            continue
        k = next((i for i, v in enumerate(add.input) if v in inits), None)
        if k is None:
            continue
        y = add.input[1 - k]
        conv = producer.get(y)
        if (conv is None or conv.op_type not in ("Conv", "ConvTranspose") or readers.get(y) != 1
                or y in outputs or conv.input[1] not in inits
                or (len(conv.input) > 2 and conv.input[2] and conv.input[2] not in inits)):
            continue
        w = inits[conv.input[1]]
        group = next((a.i for a in conv.attribute if a.name == "group"), 1)
        channels = w.dims[0] if conv.op_type == "Conv" else w.dims[1] * group
        b = numpy_helper.to_array(inits[add.input[k]]).astype(np.float64)
        rank = len(w.dims)
        if not np.issubdtype(b.dtype, np.floating) or not (
                b.size == 1 and b.ndim <= rank
                or b.size == channels and b.ndim in (rank, rank - 1)
                and b.shape[b.ndim - rank + 1] == channels):
            continue
        bias = _conv_bias(conv, inits, channels) + np.broadcast_to(b.reshape(-1), (channels,))
        _set_conv_bias(g, inits, conv, bias, f"{add.output[0]}_bias_folded")
        conv.output[0] = add.output[0]
        removed.append(add)
    for add in removed:
        g.node.remove(add)
    return out


def fold_batchnorm(model: onnx.ModelProto) -> onnx.ModelProto:
    out, inits, readers, producer, outputs = _indexed_copy(model)
    g = out.graph
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
        b = (_conv_bias(conv, inits, s.size) - mean) * s + beta
        w_name = f"{conv.input[1]}_bn_folded"
        g.initializer.append(numpy_helper.from_array(w.astype(np.float32), w_name))
        conv.input[1] = w_name
        _set_conv_bias(g, inits, conv, b, f"{bn.output[0]}_bias_bn_folded")
        conv.output[0] = bn.output[0]
        removed.append(bn)
    for bn in removed:
        g.node.remove(bn)
    used = {v for n in g.node for v in n.input} | {i.name for i in g.input}
    keep = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(keep)
    return out


__all__ = ["constants_to_initializers", "drop_identity_arithmetic", "fold_batchnorm",
           "fold_bias_add", "scale_after_matmul"]
