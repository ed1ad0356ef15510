"""Strip quantization: the float model a QDQ (or FakeQuantize) graph was quantized from.

Used by the `fp32` mode on the imported graph, before the import-cleanup passes:

- A quantization node whose inputs are all constants (DequantizeLinear of s8 weights, of an
  s32 bias, a FakeQuantize on float weights) is evaluated once (reference semantics) and
  replaced by its f32 constant: ``w_f32 = (w_q - zp)·s``.
- A QuantizeLinear on a float activation whose readers are DequantizeLinears: each
  DequantizeLinear is bypassed (its readers read the QuantizeLinear's float input), then the
  unread QuantizeLinear is removed. ``x ↦ dq(q(x))`` becomes ``x ↦ x`` — or ``clip(x, 0, hi)``
  when the quantization clamps at real 0 (zero point = qmin) right after a Conv / MatMul /
  Gemm / Add / BatchNormalization: ONNX Runtime's quantizer removes a Relu / Clip(0, 6) in
  front of such a QuantizeLinear (the clamps at 0 and at the calibrated top do its work), so
  it is put back.
- A FakeQuantize (f32 → f32) on an activation is bypassed the same way.
- Dynamic quantization (compiler/onnx_import/convert_dynamic.py): an int8 MatMul / Conv that
  reads a DynamicQuantizeLinear's output and zero point, whose int32 accumulator is cast to
  float32 and multiplied by ``s_x·s_w`` (``s_w`` a constant), becomes the float op on the
  DynamicQuantizeLinear's input with weights ``f32(w − zw)·s_w``; the Cast and the Mul go, and
  the DynamicQuantizeLinear when nothing else reads it.

Graph output names are kept (passes/replace.py ``bypass_keeping_name``). Quantization that is
part of the model's interface stays: a DequantizeLinear of an integer graph input, a
QuantizeLinear producing an integer graph output (each recorded as declined, with why).

``mark_float_compute`` then makes every float Conv / ConvTranspose / MatMul a fused node with
an empty chain (its bias input becomes the chain's first Shift), so that fuse_bias and
fuse_post_ops give the float graph f32 primitives with eltwise / sum post-ops — the float
counterpart of what the int8 pipeline builds. The fused pipeline runs it too, after
move_dequantize, on the Conv / MatMul nodes a quantized model leaves in float32 (NNCF's
squeeze-excitation convolutions on a pooled vector, attention products it does not quantize,
a quantize_static model's layers after a float op): their activations and adds become
post-ops, and a quantize only together with its dequantize (the node writes the float32
values: oneDNN's float32 convolutions and matmuls write float32 on jit kernels;
passes/fuse_post_ops.py). A bias given through a DequantizeLinear of constants is a constant
too.
"""

from __future__ import annotations

import logging

import numpy as np

from qfuse.ir import DType, Graph, Node, Op, TensorInfo
from qfuse.ir.graph import scale_product
from qfuse.ir.chain import Fused, Shift
from qfuse.ir.ops import ClipAttrs
from qfuse.passes.base import PassContext
from qfuse.passes.post_op_match import (
    constant_operand,
    drop_if_unread,
    float_compute,
    sole_reader,
)
from qfuse.passes.replace import bypass_keeping_name
from qfuse.runtime.reference import IMPLS

log = logging.getLogger(__name__)

QUANT_OPS = (Op.QUANTIZE_LINEAR, Op.DEQUANTIZE_LINEAR, Op.FAKE_QUANTIZE)
# Producers after which ONNX Runtime's quantizer removes a Relu / Clip (a tensor that is
# non-negative by construction, e.g. after a pooling of such, gets zp = 0 too: no clamp there).
ACTIVATION_HOSTS = (Op.CONV, Op.CONV_TRANSPOSE, Op.MATMUL, Op.GEMM, Op.ADD, Op.BATCH_NORM)


def _fold(graph: Graph, node: Node) -> None:
    args = [graph.constant(v) if v else None for v in node.inputs]
    out = node.outputs[0]
    array = IMPLS[node.op](node, args)[0]
    name = graph.unique_name(f"{out}_folded")
    graph.add_constant(name, np.asarray(array))
    slots = [i for i, o in enumerate(graph.outputs) if o == out]
    graph.replace_all_uses(out, name)
    graph.remove_node(node)
    if slots:  # keep the output's name: an Identity of the constant writes it
        graph.add_node(Op.IDENTITY, [name], [out], infos=[graph.info(name)], origin=node.origin)
        for i in slots:
            graph.outputs[i] = out


def run(graph: Graph, ctx: PassContext) -> int:
    """Strip quantization (module docstring); returns the number of nodes removed or folded."""
    count = 0
    for node in graph.topo_order():
        if node.op not in QUANT_OPS or not graph.has_node(node.name):
            continue
        ctx.visit(node)
        if all(graph.constant(v) is not None for v in node.inputs if v):
            _fold(graph, node)
            count += 1
            continue
        if node.op is Op.FAKE_QUANTIZE and not graph.info(node.outputs[0]).dtype.is_integer:
            reason = bypass_keeping_name(graph, node)
            if reason is None:
                count += 1
            else:
                ctx.decline(node, reason)
        elif node.op is Op.QUANTIZE_LINEAR:
            count += _strip_pair(graph, ctx, node)
        elif node.op is Op.DEQUANTIZE_LINEAR and graph.producer(node.inputs[0]) is None:
            ctx.decline(node, "dequantizes an integer graph input: part of the interface")
    for node in graph.topo_order():
        if node.fused is not None and node.fused.src_zero_point_port is not None:
            ctx.visit(node)
            why = _strip_dynamic(graph, node)
            if why is None:
                count += 1
            else:
                ctx.decline(node, why)
    return count


def _strip_dynamic(graph: Graph, node: Node) -> str | None:
    """The float op a dynamically quantized MatMul / Conv stands for (module docstring), or
    why it stays int8."""
    assert node.fused is not None and node.fused.src_zero_point_port is not None
    dql = graph.producer(node.inputs[0])
    weights = graph.constant(node.inputs[1])
    if dql is None or dql.op is not Op.DYNAMIC_QUANTIZE_LINEAR or weights is None:
        return "dynamic quantization: the source or the weights are not the expected ones"
    acc = node.outputs[0]
    cast, _ = sole_reader(graph, acc)
    if cast is None or cast.op is not Op.CAST or graph.info(cast.outputs[0]).dtype is not DType.F32:
        return "dynamic quantization: the accumulator is not cast to float32"
    mul, _ = sole_reader(graph, cast.outputs[0])
    if mul is None or mul.op is not Op.MUL:
        return "dynamic quantization: the accumulator is not scaled by a Mul"
    product_value = mul.inputs[1 - mul.inputs.index(cast.outputs[0])]
    found = scale_product(graph, product_value)
    out = graph.info(acc)
    axis = 1 if node.op is Op.CONV else len(out.shape) - 1
    if found is None or found[0] != dql.outputs[1] or found[1].size not in (1, out.shape[axis]):
        return "dynamic quantization: the scale is not s_x times a constant per channel"
    scale = found[1]
    product = graph.producer(product_value)
    w_axis = 0 if node.op is Op.CONV else weights.ndim - 1
    shape = [-1 if i == w_axis else 1 for i in range(weights.ndim)]
    real = (weights.astype(np.int64) - node.fused.wei_zero_point).astype(np.float32) \
        * scale.reshape(shape if scale.size > 1 else ())
    w_name = graph.unique_name(f"{node.inputs[1]}_f32")
    graph.add_constant(w_name, real)
    zp_port = node.fused.src_zero_point_port
    graph.set_input(node, zp_port, "")
    while node.inputs and not node.inputs[-1]:
        node.inputs.pop()
    graph.set_input(node, 0, dql.inputs[0])
    graph.set_input(node, 1, w_name)
    node.fused = None
    graph.set_info(acc, TensorInfo(out.shape, DType.F32))
    if mul.inputs[0] != cast.outputs[0]:  # bypass_keeping_name removes to input 0
        a, b = mul.inputs
        graph.set_input(mul, 0, b)
        graph.set_input(mul, 1, a)
    for gone in (cast, mul):  # their inputs are not graph outputs (sole_reader): no refusal
        why = bypass_keeping_name(graph, gone)
        assert why is None, why
    drop_if_unread(graph, [n for n in (product, dql) if n is not None])
    return None


def _strip_pair(graph: Graph, ctx: PassContext, q: Node) -> int:
    x, qout = q.inputs[0], q.outputs[0]
    if graph.info(x).dtype.np != np.float32:
        ctx.decline(q, "its input is not float")
        return 0
    removed = 0
    readers = [r for r, _ in graph.consumers(qout) if r.op is Op.DEQUANTIZE_LINEAR]
    high = implied_activation(graph, q) if readers else None
    if high is not None:
        clip = graph.add_node(Op.CLIP, [x], 1, ClipAttrs(0.0, high), name=f"{q.name}_clip",
                              infos=[graph.info(x)], origin=q.origin)
        x = clip.outputs[0]
    for reader in readers:
        graph.set_input(reader, 0, x)  # the pair is the identity on x now
        reason = bypass_keeping_name(graph, reader)
        if reason is not None:
            graph.set_input(reader, 0, qout)
            ctx.decline(reader, reason)
            continue
        removed += 1
    if graph.has_node(q.name) and not graph.uses(qout):
        graph.remove_node(q)
        removed += 1
    elif graph.has_node(q.name):
        ctx.decline(q, "its integer output is read by more than dequantizations "
                       "(or is a graph output)")
    return removed


def implied_activation(graph: Graph, q: Node) -> float | None:
    """The upper bound of the Relu / Clip(0, hi) a quantization stands for, or None.

    ONNX Runtime's quantizer removes a Relu or Clip in front of a QuantizeLinear whose range
    was calibrated on the activation's output (its QDQRemovableActivation): the clamp at real 0
    (zero point = qmin) and at the range's top do the activation's work. Stripping puts
    ``Clip(0, s·(qmax - zp))`` back after the ops that host such activations."""
    scale = graph.constant(q.inputs[1])
    zp = graph.constant(q.inputs[2]) if len(q.inputs) > 2 and q.inputs[2] else None
    qmin, qmax = q.attrs.dtype.range
    z = 0 if zp is None else np.asarray(zp).ravel()
    if scale is None or np.asarray(scale).size != 1 or np.unique(z).size != 1:
        return None
    z0 = int(np.asarray(z).ravel()[0])
    if z0 != qmin:
        return None
    producer = graph.producer(q.inputs[0])
    if producer is None or producer.op not in ACTIVATION_HOSTS:
        return None
    return float(np.float32(np.asarray(scale).ravel()[0]) * np.float32(qmax - z0))


def mark_float_compute(graph: Graph, ctx: PassContext) -> int:
    """Float Conv / ConvTranspose / MatMul → fused nodes with an empty chain (docstring)."""
    count = 0
    for node in graph.topo_order():
        if not float_compute(graph, node) or node.fused is not None:
            continue
        if any(graph.info(v).rank < 2 for v in node.inputs[:2]):
            continue  # a 1-D MatMul operand: a vector product, no channel axis for a chain
        ctx.visit(node)
        if node.op is not Op.MATMUL and constant_operand(graph, node.inputs[1])[0] is None:
            # a fused convolution's lowering reads constant weights; a float island's are
            # run-time values (the plain lowering takes them)
            ctx.decline(node, "its weights are not a constant")
            continue
        fused = Fused()
        if len(node.inputs) > 2:
            bias = constant_operand(graph, node.inputs[2])[0] if node.inputs[2] else None
            if node.inputs[2] and bias is None:
                ctx.decline(node, "its bias is not a constant")
                continue
            if bias is not None:
                fused.chain.append(Shift.of(bias))
            graph.set_input(node, 2, "")
            node.inputs.pop()
        node.fused = fused
        count += 1
    return count
