"""Elementwise math, activations, normalizations, Gemm and MatMul.

Softmax before opset 13 flattens the input to 2-D at ``axis`` and normalizes each row; that is
the IR's last-axis softmax exactly when every dim from ``axis`` to the second-to-last is 1, the
only case accepted. Clip's min/max inputs (opset 11+): a constant bound is the Clip's, a
missing one ±inf, one computed at run time a Max / Min by it (``_clip_at_run_time``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from qfuse.compiler.onnx_import.context import Context, NodeView
from qfuse.ir import DType, TensorInfo
from qfuse.ir.ops import (
    AlphaAttrs,
    AxisAttrs,
    BatchNormAttrs,
    ClipAttrs,
    GeluApprox,
    GeluAttrs,
    GemmAttrs,
    HardSigmoidAttrs,
    LayerNormAttrs,
    LogicAttrs,
    Op,
    ReshapeAttrs,
    TransposeAttrs,
)

_BINARY = {"Add": Op.ADD, "Sub": Op.SUB, "Mul": Op.MUL, "Div": Op.DIV}
_UNARY = {"Relu": Op.RELU, "Sigmoid": Op.SIGMOID, "Tanh": Op.TANH, "HardSwish": Op.HARD_SWISH,
          "Identity": Op.IDENTITY}


def binary(ctx: Context, node: NodeView) -> None:
    ctx.emit(node, _BINARY[node.op_type], node.inputs[:2])


def sum_(ctx: Context, node: NodeView) -> None:
    ctx.emit(node, Op.SUM, node.inputs)


def reciprocal(ctx: Context, node: NodeView) -> None:
    """Reciprocal(x) = 1 / x (ONNX: https://onnx.ai/onnx/operators/onnx__Reciprocal.html), a
    Div of a one-element constant 1 by x: the same IEEE division. torch.export writes rsqrt so
    (Reciprocal of Sqrt: RMSNorm, T5 and LLaMA-style models), the TorchScript exporter as
    Div(1, Sqrt(...)); both run on the binary primitive (lower_binary.lower_binary)."""
    x = ctx.input_info(node, 0)
    _float32(ctx, node, x)
    one = ctx.constant(node, "one", np.ones((1,) * max(x.rank, 1), np.float32))
    ctx.emit(node, Op.DIV, [one, node.input(0)])


def neg(ctx: Context, node: NodeView) -> None:
    """Neg(x) = −x (https://onnx.ai/onnx/operators/onnx__Neg.html) as Mul(x, −1): the same
    value for every float32, the sign of a zero and of NaN included (an eltwise linear
    ``−1·x + 0`` would turn −0 into +0). Rotary embeddings' ``rotate_half`` (LLaMA, Qwen2:
    an onnxruntime island each before)."""
    x = ctx.input_info(node, 0)
    _float32(ctx, node, x)
    minus_one = ctx.constant(node, "minus_one",
                          np.full((1,) * max(x.rank, 1), -1.0, np.float32))
    ctx.emit(node, Op.MUL, [node.input(0), minus_one])


def unary(ctx: Context, node: NodeView) -> None:
    ctx.emit(node, _UNARY[node.op_type], node.inputs[:1])


def logic(ctx: Context, node: NodeView) -> None:
    """Equal, Less, Greater, LessOrEqual, GreaterOrEqual, And, Or, Xor, Not: one Logic node
    (a numpy kernel; an attention mask's ``mask == 0``). Both operands of one type."""
    arity = 1 if node.op_type == "Not" else 2
    types = {ctx.input_info(node, i).dtype for i in range(arity)}
    if len(types) != 1:
        raise ctx.malformed(node, f"operands of types {sorted(t.name for t in types)}")
    ctx.emit(node, Op.LOGIC, node.inputs[:arity], LogicAttrs(node.op_type))


def where(ctx: Context, node: NodeView) -> None:
    ctx.emit(node, Op.WHERE, node.inputs[:3])


def prelu(ctx: Context, node: NodeView) -> None:
    ctx.emit(node, Op.PRELU, node.inputs[:2])


def leaky_relu(ctx: Context, node: NodeView) -> None:
    ctx.emit(node, Op.LEAKY_RELU, node.inputs[:1], AlphaAttrs(float(node.attr("alpha", 0.01))))


def hard_sigmoid(ctx: Context, node: NodeView) -> None:
    attrs = HardSigmoidAttrs(float(node.attr("alpha", 0.2)), float(node.attr("beta", 0.5)))
    ctx.emit(node, Op.HARD_SIGMOID, node.inputs[:1], attrs)


def clip(ctx: Context, node: NodeView) -> None:
    bounds = []
    runtime: dict[int, str] = {}
    for port, what, default in ((1, "min", -math.inf), (2, "max", math.inf)):
        name = node.input(port)
        if name and not ctx.is_const(name):
            runtime[port] = name
            bounds.append(default)
            continue
        value = ctx.optional_const(node, port, what)
        if value is None:
            bounds.append(default)
        elif value.size != 1:
            raise ctx.malformed(node, f"{what} must be a scalar, got shape {value.shape}")
        else:
            bounds.append(float(value.reshape(())))
    if any(math.isnan(b) for b in bounds):
        raise ctx.malformed(node, f"Clip bounds {bounds} contain NaN")
    if runtime:
        _clip_at_run_time(ctx, node, bounds, runtime)
        return
    ctx.emit(node, Op.CLIP, node.inputs[:1], ClipAttrs(bounds[0], bounds[1]))


def _clip_at_run_time(ctx: Context, node: NodeView, bounds: list[float],
                      runtime: dict[int, str]) -> None:
    """A Clip with a bound computed at run time (a log-mel spectrogram's floor,
    ``max(x, max(x) − 80)``) as ONNX defines it, ``min(max(x, lo), hi)``: a Max by the
    run-time lower bound (or a Clip by the constant one), then a Min by the upper bound (or
    the Clip), each a binary primitive reading the one-value bound broadcast."""
    for name in runtime.values():
        info = ctx.info(node, name)
        if info.dtype is not DType.F32 or math.prod(info.shape) != 1:
            raise ctx.unsupported(node, f"bound '{name}' is computed at run time and is not "
                                        "one float32 value")
    value, out = node.inputs[0], node.outputs[0]
    steps: list[tuple[str, Op, list[str], object]] = []
    if 1 in runtime:
        steps.append(("max", Op.MAX, [runtime[1]], None))
    if bounds[0] > -math.inf or bounds[1] < math.inf:
        steps.append(("clip", Op.CLIP, [], ClipAttrs(bounds[0], bounds[1])))
    if 2 in runtime:
        steps.append(("min", Op.MIN, [runtime[2]], None))
    for i, (tag, op, extra, attrs) in enumerate(steps):
        last = i == len(steps) - 1
        target = out if last else ctx.graph.unique_name(f"{out}@{tag}")
        part = replace(node, name=node.name if last else f"{node.name}/{tag}")
        ctx.emit(part, op, [value, *extra], attrs, outputs=[target])
        value = target


def max_min(ctx: Context, node: NodeView) -> None:
    """Max / Min of a tensor and one constant value: a Clip with that bound (TensorFlow's
    ``tf.maximum(x, c)`` after a LeakyRelu, openWakeWord's embedding model: 19 onnxruntime
    islands). The reference computes both as ``numpy.maximum(x, c)``; a zero constant given
    first keeps the op (``numpy.maximum(0, -0)`` is -0, the Clip's +0). Other forms have no
    native lowering (an island)."""
    inputs = [name for name in node.inputs if name]
    consts = [name for name in inputs if ctx.is_const(name)]
    op = Op.MAX if node.op_type == "Max" else Op.MIN
    if len(inputs) == 2 and not consts and all(
            ctx.info(node, name).dtype is DType.F32 for name in inputs):
        ctx.emit(node, op, inputs)  # oneDNN's binary_max / binary_min
        return
    if len(inputs) != 2 or len(consts) != 1:
        raise ctx.unsupported(node, f"op {node.op_type} of {len(inputs)} inputs, {len(consts)} "
                                    "of them constant, has no native lowering (two float32 "
                                    "tensors, or one and a constant value, have)")
    x = next(name for name in inputs if name not in consts)
    value = np.asarray(ctx.consts[consts[0]])
    rank = len(ctx.info(node, x).shape)
    if value.size != 1 or value.ndim > rank or value.dtype != np.float32:
        raise ctx.unsupported(node, f"op {node.op_type} with a constant of shape "
                                    f"{list(value.shape)} ({value.dtype}) has no native lowering")
    bound = float(value.reshape(()))
    if math.isnan(bound) or (bound == 0 and inputs[0] == consts[0]):
        raise ctx.unsupported(node, f"op {node.op_type} with the constant {bound} first has no "
                                    "native lowering")
    bounds = (bound, math.inf) if node.op_type == "Max" else (-math.inf, bound)
    ctx.emit(node, Op.CLIP, [x], ClipAttrs(*bounds))


def gelu(ctx: Context, node: NodeView) -> None:
    """The opset 20 Gelu op, or a decomposed GELU recognized by patterns.fuse_gelu."""
    approximate = str(node.attr("approximate", "none"))
    try:
        mode = GeluApprox(approximate)
    except ValueError as exc:
        raise ctx.malformed(node, f"unknown approximate '{approximate}'") from exc
    ctx.emit(node, Op.GELU, node.inputs[:1], GeluAttrs(mode))


def _axis(ctx: Context, node: NodeView, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise ctx.malformed(node, f"axis {axis} is out of range for rank {rank}")
    return axis % rank


def _float32(ctx: Context, node: NodeView, x: TensorInfo) -> None:
    if x.dtype not in (DType.F32, DType.U8, DType.S8):
        raise ctx.unsupported(node, f"the native kernel reads float32, not {x.dtype.name}")


def softmax(ctx: Context, node: NodeView) -> None:
    """Softmax and LogSoftmax (the same axis rules)."""
    x = ctx.input_info(node, 0)
    _float32(ctx, node, x)
    if ctx.opset >= 13:
        axis = _axis(ctx, node, int(node.attr("axis", -1)), x.rank)
    else:
        axis = _axis(ctx, node, int(node.attr("axis", 1)), x.rank)
        if any(d != 1 for d in x.shape[axis:-1]):
            raise ctx.unsupported(
                node, f"opset {ctx.opset} {node.op_type} on axis {axis} of shape {x.shape} "
                      f"normalizes over the flattened dims {axis}.., which differs from a "
                      f"last-axis softmax; not supported")
        axis = x.rank - 1
    op = Op.LOG_SOFTMAX if node.op_type == "LogSoftmax" else Op.SOFTMAX
    ctx.emit(node, op, node.inputs[:1], AxisAttrs(axis))


def layer_norm(ctx: Context, node: NodeView) -> None:
    ctx.check_unused(node, 1, "Mean / InvStdDev")
    x = ctx.input_info(node, 0)
    _float32(ctx, node, x)
    axis = _axis(ctx, node, int(node.attr("axis", -1)), x.rank)
    attrs = LayerNormAttrs(axis, float(node.attr("epsilon", 1e-5)))
    ctx.emit(node, Op.LAYER_NORM, node.inputs[:3], attrs)


def instance_norm(ctx: Context, node: NodeView) -> None:
    """InstanceNormalization(x, scale, B) on [N, C, D...] normalizes each (n, c) over D...:
    the statistics of LayerNormalization over axis 2, which oneDNN runs (its scale and bias
    are per normalized element, so this one's per-channel scale and B follow as Mul and Add
    when they are not 1 and 0). torch exports GroupNorm(G, C) as a Reshape to [N, G, -1], this
    op with scale 1 and B 0, a Reshape back and its own affine Mul / Add (PoolFormer, U-Nets,
    detection heads). ONNX: https://onnx.ai/onnx/operators/onnx__InstanceNormalization.html"""
    x = ctx.input_info(node, 0)
    _float32(ctx, node, x)
    if x.rank < 3:
        raise ctx.malformed(node, f"input of rank {x.rank}; InstanceNormalization needs "
                                  f"[N, C, D...]")
    scale = np.asarray(ctx.parameter(node, 1, "the scale"), np.float32).ravel()
    bias = np.asarray(ctx.parameter(node, 2, "B"), np.float32).ravel()
    channels = x.shape[1]
    if scale.size != channels or bias.size != channels:
        raise ctx.malformed(node, f"scale and B hold {scale.size} and {bias.size} values for "
                                  f"{channels} channels")
    one = ctx.constant(node, "one", np.ones(1, np.float32))
    attrs = LayerNormAttrs(2, float(node.attr("epsilon", 1e-5)))
    affine = [(op, values) for op, values, neutral in ((Op.MUL, scale, 1.0), (Op.ADD, bias, 0.0))
              if np.any(values != neutral)]
    if not affine:
        ctx.emit(node, Op.LAYER_NORM, [node.input(0), one], attrs)
        return
    value = ctx.graph.unique_name(f"{node.outputs[0]}@normalized")
    ctx.emit(node, Op.LAYER_NORM, [node.input(0), one], attrs, outputs=[value])
    per_channel = (channels,) + (1,) * (x.rank - 2)
    for i, (op, values) in enumerate(affine):
        operand = ctx.constant(node, op.value.lower(), values.reshape(per_channel))
        last = i == len(affine) - 1
        out = node.outputs[0] if last else ctx.graph.unique_name(f"{node.outputs[0]}@scaled")
        ctx.emit(node, op, [value, operand], outputs=[out])
        value = out


def batch_norm(ctx: Context, node: NodeView) -> None:
    if node.attr("training_mode", 0):
        raise ctx.unsupported(node, "training_mode=1 is not supported (inference only)")
    ctx.check_unused(node, 1, "running mean / var")
    ctx.emit(node, Op.BATCH_NORM, node.inputs[:5], BatchNormAttrs(float(node.attr("epsilon",
                                                                                  1e-5))))


def gemm(ctx: Context, node: NodeView) -> None:
    attrs = GemmAttrs(float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0)),
                      bool(node.attr("transA", 0)), bool(node.attr("transB", 0)))
    ctx.emit(node, Op.GEMM, node.inputs[:3], attrs)


def matmul(ctx: Context, node: NodeView) -> None:
    ctx.emit(node, Op.MATMUL, node.inputs[:2])


def einsum(ctx: Context, node: NodeView) -> None:
    """A two-operand Einsum that is a batched matrix product becomes Transposes and Reshapes
    around a MatMul (ONNX spec: https://onnx.ai/onnx/operators/onnx__Einsum.html): the letters
    of both operands and the output are the batch (``B``), those of both operands only are
    summed (``K``), the others each operand's own (``M`` of A, ``N`` of B), so A seen as
    ``[B.., M, K]`` times B seen as ``[B.., K, N]`` is the output's ``[B.., M.., N..]`` in some
    order. Attention's ``bgnid,bgnjd->bgnij`` (MaxViT) needs Transposes only; MViTv2's
    relative positions ``byhwc,hkc->byhwk`` a batch letter inside A and three own letters of
    A merged into one M. The sums are MatMul's. Any other equation (a trace, a broadcast
    ellipsis, a letter repeated, a letter summed within one operand, three operands,
    batch dims of different sizes) stays a float island."""
    shapes = [ctx.input_info(node, i).shape for i in range(len(node.inputs))]
    plan = _matmul_einsum(str(node.attr("equation", "")), shapes)
    if isinstance(plan, str):
        raise ctx.unsupported(node, f"equation {node.attr('equation')!r}: {plan}")
    name = node.outputs[0]
    operands = []
    for port, (perm, seen) in enumerate(((plan.perm_a, plan.shape_a),
                                         (plan.perm_b, plan.shape_b))):
        value = node.inputs[port]
        if perm != tuple(range(len(perm))):
            moved = ctx.graph.unique_name(f"{name}@operand{port}")
            ctx.emit(node, Op.TRANSPOSE, [value], TransposeAttrs(perm), outputs=[moved])
            value = moved
        if seen != tuple(shapes[port][d] for d in perm):
            merged = ctx.graph.unique_name(f"{name}@operand{port}_3d")
            ctx.emit(node, Op.RESHAPE, [value], ReshapeAttrs(seen), outputs=[merged])
            value = merged
        operands.append(value)
    after = []  # the MatMul's [B.., M, N] split into [B.., M.., N..], then in the output's order
    if plan.product != plan.matmul:
        after.append((Op.RESHAPE, ReshapeAttrs(plan.product)))
    if plan.perm_out != tuple(range(len(plan.perm_out))):
        after.append((Op.TRANSPOSE, TransposeAttrs(plan.perm_out)))
    value = operands
    for index, (op, attrs) in enumerate([(Op.MATMUL, None), *after]):
        out = name if index == len(after) else ctx.graph.unique_name(f"{name}@{op.value.lower()}")
        ctx.emit(node, op, value, attrs, outputs=[out])
        value = [out]


@dataclass(frozen=True)
class _EinsumPlan:
    """How one Einsum runs as a MatMul: the operands' permutations and ``[B.., M, K]`` /
    ``[B.., K, N]`` shapes, the MatMul's ``[B.., M, N]``, that split into ``[B.., M.., N..]``
    (``product``) and its permutation to the output."""

    perm_a: tuple[int, ...]
    shape_a: tuple[int, ...]
    perm_b: tuple[int, ...]
    shape_b: tuple[int, ...]
    matmul: tuple[int, ...]
    product: tuple[int, ...]
    perm_out: tuple[int, ...]


def _matmul_einsum(equation: str, shapes: list[tuple[int, ...]]) -> _EinsumPlan | str:
    """The MatMul form of an Einsum equation over operands of ``shapes``, or why there is
    none (``einsum``)."""
    text = equation.replace(" ", "")
    if "->" not in text or "." in text:
        return "no explicit output, or an ellipsis"
    inputs, out = text.split("->")
    terms = inputs.split(",")
    if len(terms) != 2 or [len(t) for t in terms] != [len(s) for s in shapes]:
        return "not two operands with a letter per dim"
    a, b = terms
    if any(len(set(t)) != len(t) for t in (a, b, out)):
        return "a letter repeats within a term"
    if any(c not in a and c not in b for c in out):
        return "an output letter in neither operand"
    batch = [c for c in out if c in a and c in b]
    summed = [c for c in a if c in b and c not in out]
    own_a = [c for c in a if c not in b]
    own_b = [c for c in b if c not in a]
    if any(c not in out for c in own_a + own_b):
        return "a letter summed within one operand"
    size = {**dict(zip(b, shapes[1], strict=True)), **dict(zip(a, shapes[0], strict=True))}
    if any(shapes[0][a.index(c)] != shapes[1][b.index(c)] for c in batch + summed):
        return "a batch or summed dim differs between the operands (a broadcast)"
    dims = [size[c] for c in batch]
    m = math.prod(size[c] for c in own_a)
    k = math.prod(size[c] for c in summed)
    n = math.prod(size[c] for c in own_b)
    product = [*batch, *own_a, *own_b]
    return _EinsumPlan(
        perm_a=tuple(a.index(c) for c in [*batch, *own_a, *summed]),
        shape_a=(*dims, m, k),
        perm_b=tuple(b.index(c) for c in [*batch, *summed, *own_b]),
        shape_b=(*dims, k, n),
        matmul=(*dims, m, n),
        product=tuple(size[c] for c in product),
        perm_out=tuple(product.index(c) for c in out))


def dropout(ctx: Context, node: NodeView) -> None:
    ctx.check_unused(node, 1, "mask")
    training = ctx.optional_const(node, 2, "training_mode")
    if training is not None and bool(np.any(training)):
        raise ctx.unsupported(node, "training_mode=True is not supported (inference only)")
    ctx.emit(node, Op.DROPOUT, node.inputs[:1])
