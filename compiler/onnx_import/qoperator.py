"""QOperator ops rewritten at import into the QDQ form: DequantizeLinear → float op →
QuantizeLinear, the IR onnxruntime's quantize_static(quant_format=QDQ) produces, so every pass
and fusion applies unchanged.

``expand(ctx, node)`` returns the standard-domain nodes that stand for ``node`` (None when it
is not a QOperator op); the importer converts them in order like any other node. Each op's
meaning (ONNX spec for the standard ops, onnxruntime's contrib op schemas,
docs/ContribOperators.md and onnxruntime/contrib_ops/cpu/quantization/*.cc for com.microsoft):

- QLinearConv(x, sx, zx, w, sw, zw, sy, zy[, B]):
  ``y = Q(conv(DQ(x), DQ(w; axis 0)) + DQ(B; sx·sw[oc], axis 0))``. The int32 bias is added to
  the integer accumulator, i.e. it is at scale sx·sw (what the QDQ quantizer writes as a
  separate DequantizeLinear).
- QLinearMatMul(a, sa, za, b, sb, zb, sy, zy): ``Q(DQ(a) @ DQ(b; axis rank-1))``.
- QGemm (com.microsoft; A, sa, za, B, sb, zb[, C, sy, zy]; alpha, transA, transB): C is int32
  added to the accumulator before ``alpha·sa·sb`` multiplies it, so C is at scale
  ``alpha·sa·sb`` (checked bit-exactly against onnxruntime with alpha = 0.5). Without sy the
  output is float: ``alpha·DQ(A)·DQ(B) + DQ(C)``.
- ConvInteger / MatMulInteger (x, w[, zx, zw]) → int32: ``Σ (x - zx)·(w - zw)``, written as
  ``Cast_int32(conv(DQ(x; 1, zx), DQ(w; 1, zw)))``. Exact when every partial sum is an
  integer below 2^24 in magnitude (float32 holds it exactly, so neither the float reference
  nor oneDNN's f32(acc) rounds); the bound ``max|x - zx|·Σ|w - zw|`` per output is checked
  on the constant weights and the rewrite is refused (naming the bound) when it can exceed it.
- QLinearAdd / QLinearMul (A, sA, zA, B, sB, zB, sC, zC): ``Q(DQ(A) ∘ DQ(B))``.
- DynamicQuantizeMatMul (com.microsoft; A, B, b_scale[, b_zero_point, bias]) and
  MatMulIntegerToFloat (A, B, a_scale, b_scale[, a_zero_point, b_zero_point, bias]), what
  onnxruntime's optimizer fuses quantize_dynamic's ops into: back to those standard ops,
  ``Cast_f32(MatMulInteger(A_q, B, a_zp, b_zp))·(a_scale·b_scale) + bias`` with
  ``A_q, a_scale, a_zp = DynamicQuantizeLinear(A)`` for the first (convert_dynamic.py then
  makes them one int8 kernel). Measured equal to onnxruntime's fused kernels where those do
  not saturate (7-bit weights; tests/compiler/test_dynamic_quantization.py).
- QLinearConcat (sY, zY, (x_i, s_i, z_i)...; axis): ``Q(concat(DQ(x_i)))``.
- QLinearAveragePool / QLinearGlobalAveragePool (x, sx, zx, sy, zy; channels_last):
  ``Q(pool(DQ(x)))``; channels_last inputs are transposed to NCHW and back.
- QLinearSigmoid / QLinearLeakyRelu (alpha) / QLinearSoftmax (axis, opset):
  ``Q(f(DQ(x)))`` (onnxruntime evaluates these through a 256-entry table of exactly that
  float formula, softmax through exp tables).

Standard ops that QOperator models apply to u8/s8 tensors directly: MaxPool, Reshape, Flatten,
Transpose, (Un)Squeeze, Split, Slice, Pad, Identity and nearest Resize become
``Q(op(DQ(x)))`` with x's scale and zero point (exact, and the form the QDQ quantizer writes);
a linear Resize of u8/s8 data is ``Cast_T(Resize(Cast_f32(x)))``: onnxruntime interpolates in
float32 and truncates toward zero.

Weights: a constant u8 (or s8) weight with zero point zw whose ``w - zw`` fits in int8 is
stored as s8 with zero point 0 (exact: DQ gives the same ``(w - zw)·s``), the form the int8
kernels take. An absent zero point is 0 of the input's type.

Not rewritten, and so run as float islands (compiler/onnx_import/islands.py) with the reason:
QLinearWhere. (DynamicQuantizeLinear and the MatMulInteger / ConvInteger reading its
run-time zero point are native ops: convert_dynamic.py.) QLinearReduceMean has
a schema but no CPU kernel in onnxruntime 1.32, so no model runs it; it is left unsupported.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from qfuse.compiler.onnx_import import convert_dynamic
from qfuse.compiler.onnx_import.context import (
    DEFAULT_DOMAINS,
    DEQUANTIZED_PORTS,
    Context,
    NodeView,
)
from qfuse.compiler.onnx_import.convert_quant import as_int8, centered_weights
from qfuse.runtime.numerics.rounding import F32_EXACT

MS_DOMAIN = "com.microsoft"

_REFUSED = {
    "QLinearWhere": "QLinearWhere is not supported",
}


class _Builder:
    """Collects the standard nodes standing for one QOperator node."""

    def __init__(self, ctx: Context, node: NodeView) -> None:
        self.ctx, self.node = ctx, node
        self.parts: list[NodeView] = []
        self._names: set[str] = set()

    def fresh(self, suffix: str) -> str:
        base = f"{self.node.name}/{suffix}"
        name, i = base, 1
        while (name in self._names or name in self.ctx.uses or name in self.ctx.consts
               or name in self.ctx.graph.values):
            name, i = f"{base}_{i}", i + 1
        self._names.add(name)
        return name

    def const(self, suffix: str, data: np.ndarray) -> str:
        name = self.fresh(suffix)
        self.ctx.set_const(name, data)
        return name

    def add(self, op_type: str, inputs: list[str], output: str | list[str] | None = None,
            name: str | None = None, **attrs: object) -> str:
        output = output or self.fresh(f"{op_type}_out")
        outputs = output if isinstance(output, list) else [output]
        name = name or self.fresh(op_type)
        while inputs and not inputs[-1]:
            inputs = inputs[:-1]
        proto = helper.make_node(op_type, inputs, outputs, name=name,
                                 **{k: v for k, v in attrs.items() if v is not None})
        view = NodeView.from_proto(proto, name)
        view.origin = [self.node.name]
        self.parts.append(view)
        return outputs[0]

    def dq(self, x: str, scale: str, zp: str, what: str, axis: int | None = None) -> str:
        return self.add("DequantizeLinear", [x, scale, zp], self.fresh(f"{what}_f32"),
                        self.fresh(f"{what}_DequantizeLinear"), axis=axis)

    def dequantized(self, *what: str) -> list[str]:
        """The node's integer inputs at its DEQUANTIZED_PORTS (context.py), each through a
        DequantizeLinear of the scale and zero point ports beside it, named ``what``: the
        reads convert_quant.py counts on when a pair computed in float32 feeds the node."""
        n = self.node
        domain = "" if n.domain in DEFAULT_DOMAINS else n.domain
        ports = DEQUANTIZED_PORTS[(domain, n.op_type)]
        return [self.dq(n.input(x), n.input(s), n.input(z), name)
                for (x, s, z), name in zip(ports, what, strict=True)]

    def q(self, x: str, scale: str, zp: str, output: str) -> str:
        """QuantizeLinear to the type of the node's first input when ``zp`` is absent (the
        com.microsoft ops' optional zero points default to 0 of type T)."""
        if not zp:
            first = self.node.inputs[0] if self.node.op_type != "QLinearConcat" else \
                self.node.inputs[2]
            dtype = self.ctx.info(self.node, first).dtype.np
            zp = self.const("zero_point", np.zeros((), dtype))
        return self.add("QuantizeLinear", [x, scale, zp], output,
                        self.fresh("QuantizeLinear"))


def expand(ctx: Context, node: NodeView) -> list[NodeView] | None:
    """The standard nodes standing for QOperator ``node``, or None if it is not one."""
    domain = "" if node.domain in DEFAULT_DOMAINS else node.domain
    rule = _RULES.get((domain, node.op_type))
    if domain == "" and node.op_type in _PRESERVING and _requantizable(ctx, node):
        rule = _requantized
    elif rule is _integer_resize and not _is_integer_linear_resize(ctx, node):
        return None
    elif rule in _INTEGER_RULES.values() and convert_dynamic.runtime_zero_point(ctx, node):
        return None  # the converter's int8 node (convert_dynamic.py)
    if rule is None:
        if (domain in ("", MS_DOMAIN)) and node.op_type in _REFUSED:
            raise ctx.unsupported(node, _REFUSED[node.op_type])
        return None
    b = _Builder(ctx, node)
    rule(b)
    return b.parts


# ----------------------------------------------------------------------------- weights
def _weight(b: _Builder, port: int, zp_port: int, scale_port: int | None, axis: int,
            what: str) -> str:
    """DQ of a weight input; a constant u8/s8 weight is re-stored as s8 with zero point 0
    when ``w - zw`` fits (exact). ``scale_port`` None means scale 1 (ConvInteger)."""
    ctx, node = b.ctx, b.node
    w_name, zp_name = node.input(port), node.input(zp_port)
    if scale_port is not None:
        scale = node.input(scale_port)
    else:  # unit scale, shaped like the zero point (DequantizeLinear pairs them)
        size = ctx.consts[zp_name].size if zp_name and ctx.is_const(zp_name) else 1
        scale = b.const(f"{what}_unit_scale", np.ones(size, np.float32) if size > 1
                        else np.array(1.0, np.float32))
    if not ctx.is_const(w_name) or (zp_name and not ctx.is_const(zp_name)):
        return b.dq(w_name, scale, zp_name, what, _axis_for(ctx, scale, axis))
    w = ctx.consts[w_name]
    zp = ctx.consts[zp_name] if zp_name else np.zeros((), w.dtype)
    if w.dtype in (np.uint8, np.int8) and (zp.size == 1 or zp.ndim == 1) and (
            np.any(zp) or w.dtype == np.uint8):
        s8 = as_int8(centered_weights(w, zp, axis))
        if s8 is not None:
            w_name, zp_name = b.const(f"{what}_s8", s8), ""
    return b.dq(w_name, scale, zp_name, what, _axis_for(ctx, scale, axis))


def _axis_for(ctx: Context, scale: str, axis: int) -> int | None:
    """The axis attribute of a DQ whose scale may be per-axis (None: per tensor)."""
    data = ctx.consts.get(scale)
    return axis if data is not None and data.size > 1 else None


def _bias(b: _Builder, port: int, scale: np.ndarray, what: str = "bias") -> str:
    """DQ of an int32 bias at ``scale`` (per tensor or per output channel, axis 0)."""
    name = b.node.input(port)
    if not name:
        return ""
    scale = np.asarray(scale, np.float32).reshape(-1)
    scale_name = b.const(f"{what}_scale", scale if scale.size > 1 else scale.reshape(()))
    return b.dq(name, scale_name, "", what, 0 if scale.size > 1 else None)


def _scale(b: _Builder, port: int, what: str) -> np.ndarray:
    return np.asarray(b.ctx.const(b.node, port, what), np.float32)


def _window_attrs(node: NodeView, keys: tuple[str, ...]) -> dict[str, object]:
    return {k: node.attrs[k] for k in keys if k in node.attrs}


_CONV_KEYS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
_POOL_KEYS = ("auto_pad", "ceil_mode", "count_include_pad", "kernel_shape", "pads", "strides")


# ------------------------------------------------------------------------------- rules
def _qlinear_conv(b: _Builder) -> None:
    n = b.node
    x, = b.dequantized("x")
    w = _weight(b, 3, 5, 4, 0, "w")
    bias = _bias(b, 8, _scale(b, 1, "x_scale") * _scale(b, 4, "w_scale"))
    y = b.add("Conv", [x, w, bias], name=n.name, **_window_attrs(n, _CONV_KEYS))
    b.q(y, n.input(6), n.input(7), n.outputs[0])


def _qlinear_matmul(b: _Builder) -> None:
    n = b.node
    a, = b.dequantized("a")
    b_rank = b.ctx.info(n, n.input(3)).rank
    w = _weight(b, 3, 5, 4, b_rank - 1, "b")
    y = b.add("MatMul", [a, w], name=n.name)
    b.q(y, n.input(6), n.input(7), n.outputs[0])


def _qgemm(b: _Builder) -> None:
    n = b.node
    alpha = float(n.attr("alpha", 1.0))
    trans_b = int(n.attr("transB", 0))
    a, = b.dequantized("a")
    w = _weight(b, 3, 5, 4, 0 if trans_b else 1, "b")
    bias = _bias(b, 6, np.float32(alpha) * _scale(b, 1, "a_scale") * _scale(b, 4, "b_scale"))
    quantized = bool(n.input(7))
    y = b.add("Gemm", [a, w, bias], None if quantized else n.outputs[0], n.name, alpha=alpha,
              transA=int(n.attr("transA", 0)), transB=trans_b)
    if quantized:
        b.q(y, n.input(7), n.input(8), n.outputs[0])


def _integer(op_type: str) -> object:
    def rule(b: _Builder) -> None:
        n = b.node
        one = b.const("x_unit_scale", np.array(1.0, np.float32))
        x = b.dq(n.input(0), one, n.input(2), "x")
        w_rank = b.ctx.info(n, n.input(1)).rank
        axis = 0 if op_type == "ConvInteger" else w_rank - 1
        _check_exact(b, axis)
        w = _weight(b, 1, 3, None, axis, "w")
        attrs = _window_attrs(n, _CONV_KEYS) if op_type == "ConvInteger" else {}
        y = b.add(op_type.removesuffix("Integer"), [x, w], name=n.name, **attrs)
        b.add("Cast", [y], n.outputs[0], b.fresh("Cast"), to=TensorProto.INT32)
    return rule


_INTEGER_RULES = {op: _integer(op) for op in ("ConvInteger", "MatMulInteger")}


def _integer_to_float(b: _Builder, a: str, a_scale: str, a_zp: str, b_ports: tuple[int, ...]
                      ) -> None:
    """``Cast_f32(MatMulInteger(a, B, a_zp, b_zp))·(a_scale·b_scale) [+ bias]``: the standard
    ops quantize_dynamic writes, which onnxruntime's optimizer fuses into its contrib ops
    (B, b_scale, b_zero_point, bias at ``b_ports``)."""
    n = b.node
    w, w_scale, w_zp, bias = (n.input(p) for p in b_ports)
    acc = b.add("MatMulInteger", [a, w, a_zp, w_zp])
    f = b.add("Cast", [acc], to=TensorProto.FLOAT)
    product = b.add("Mul", [a_scale, w_scale])
    y = b.add("Mul", [f, product], None if bias else n.outputs[0])
    if bias:
        b.add("Add", [y, bias], n.outputs[0])


def _dynamic_quantize_matmul(b: _Builder) -> None:
    """com.microsoft DynamicQuantizeMatMul(A, B, b_scale, b_zero_point, bias): A quantized by
    DynamicQuantizeLinear, then ``_integer_to_float``."""
    q, scale, zp = b.fresh("a_quantized"), b.fresh("a_scale"), b.fresh("a_zero_point")
    b.add("DynamicQuantizeLinear", [b.node.input(0)], [q, scale, zp])
    _integer_to_float(b, q, scale, zp, (1, 2, 3, 4))


def _matmul_integer_to_float(b: _Builder) -> None:
    """com.microsoft MatMulIntegerToFloat(A, B, a_scale, b_scale, a_zero_point, b_zero_point,
    bias): ``_integer_to_float`` on an 8-bit A."""
    n = b.node
    _integer_to_float(b, n.input(0), n.input(2), n.input(4), (1, 3, 5, 6))


def _centered(b: _Builder, axis: int) -> np.ndarray | None:
    """``w - zw`` as int32 for a constant weight (input 1) and zero point (input 3)."""
    n, ctx = b.node, b.ctx
    if not ctx.is_const(n.input(1)) or (n.input(3) and not ctx.is_const(n.input(3))):
        return None
    return centered_weights(ctx.consts[n.input(1)],
                            ctx.consts[n.input(3)] if n.input(3) else None, axis)


def _check_exact(b: _Builder, axis: int) -> None:
    """Refuse ConvInteger / MatMulInteger when a partial sum could pass 2^24 (docstring)."""
    n, ctx = b.node, b.ctx
    x_info = ctx.info(n, n.input(0))
    x_low, x_high = x_info.dtype.range
    zx = int(np.asarray(ctx.consts[n.input(2)]).reshape(-1)[0]) if n.input(2) and \
        ctx.is_const(n.input(2)) else (0 if n.input(2) == "" else None)
    x_max = max(x_high - x_low, 0) if zx is None else max(zx - x_low, x_high - zx)
    centered = _centered(b, axis)
    if centered is not None:
        reduce_axes = tuple(i for i in range(centered.ndim) if i != axis % centered.ndim)
        if n.op_type == "ConvInteger":
            bound = int(np.abs(centered).sum(axis=reduce_axes).max(initial=0)) * x_max
        else:  # MatMulInteger: K is the second-to-last axis of B
            bound = int(np.abs(centered).sum(axis=-2).max(initial=0)) * x_max
    else:
        w_info = ctx.info(n, n.input(1))
        w_low, w_high = w_info.dtype.range
        k = int(np.prod(w_info.shape[1:])) if n.op_type == "ConvInteger" else (
            w_info.shape[-2] if w_info.rank >= 2 else w_info.shape[0])
        bound = k * x_max * (w_high - w_low)
    if bound > F32_EXACT:
        raise ctx.unsupported(n, f"its int32 sums can reach {bound} > 2^24, which qfuse's "
                                 f"float path cannot hold exactly")


def _binary(op_type: str) -> object:
    def rule(b: _Builder) -> None:
        n = b.node
        lhs, rhs = b.dequantized("a", "b")
        y = b.add(op_type, [lhs, rhs], name=n.name)
        b.q(y, n.input(6), n.input(7), n.outputs[0])
    return rule


def _qlinear_concat(b: _Builder) -> None:
    n = b.node
    rest = n.inputs[2:]
    if len(rest) % 3 or not rest:
        raise b.ctx.malformed(n, f"takes Y_scale, Y_zero_point and (tensor, scale, zero point) "
                           f"triples; got {len(n.inputs)} inputs")
    parts = [b.dq(rest[i], rest[i + 1], rest[i + 2], f"x{i // 3}")
             for i in range(0, len(rest), 3)]
    y = b.add("Concat", parts, name=n.name, axis=int(n.attr("axis", 0)))
    b.q(y, n.input(0), n.input(1), n.outputs[0])


def _channels_last(b: _Builder, x: str, back: bool) -> str:
    rank = b.ctx.info(b.node, b.node.input(0)).rank
    perm = [0, rank - 1, *range(1, rank - 1)]
    if back:
        perm = [int(i) for i in np.argsort(perm)]
    return b.add("Transpose", [x], perm=perm)


def _pool(op_type: str) -> object:
    def rule(b: _Builder) -> None:
        n = b.node
        x, = b.dequantized("x")
        channels_last = bool(n.attr("channels_last", 0))
        if channels_last:
            x = _channels_last(b, x, back=False)
        attrs = _window_attrs(n, _POOL_KEYS) if op_type == "AveragePool" else {}
        y = b.add(op_type, [x], name=n.name, **attrs)
        if channels_last:
            y = _channels_last(b, y, back=True)
        b.q(y, n.input(3), n.input(4), n.outputs[0])
    return rule


def _unary(op_type: str, keys: tuple[str, ...] = ()) -> object:
    def rule(b: _Builder) -> None:
        n = b.node
        x, = b.dequantized("x")
        y = b.add(op_type, [x], name=n.name, **_window_attrs(n, keys))
        b.q(y, n.input(3), n.input(4), n.outputs[0])
    return rule


def _qlinear_softmax(b: _Builder) -> None:
    """The node's ``opset`` attribute says which Softmax it is: before 13 the input is
    flattened at ``axis`` (default 1), from 13 on ``axis`` (default -1) is normalized. Both
    become a last-axis softmax when they are one, else the opset-13 form at the model's
    opset 13+."""
    n, ctx = b.node, b.ctx
    rank = ctx.info(n, n.input(0)).rank
    shape = ctx.info(n, n.input(0)).shape
    node_opset = int(n.attr("opset", 13))
    axis = int(n.attr("axis", -1 if node_opset >= 13 else 1))
    if not -rank <= axis < rank:
        raise ctx.malformed(n, f"axis {axis} is out of range for rank {rank}")
    axis %= rank
    if node_opset < 13 and any(d != 1 for d in shape[axis:-1]):
        raise ctx.unsupported(n, f"opset {node_opset} softmax on axis {axis} of shape "
                                 f"{shape} normalizes flattened dims; not supported")
    last = node_opset < 13 or axis == rank - 1
    if not last and ctx.opset < 13:
        raise ctx.unsupported(n, f"softmax on axis {axis} (not the last) in an opset "
                                 f"{ctx.opset} model is not supported")
    x, = b.dequantized("x")
    y = b.add("Softmax", [x], name=n.name, axis=-1 if last else axis)
    b.q(y, n.input(3), n.input(4), n.outputs[0])


def _is_integer_linear_resize(ctx: Context, node: NodeView) -> bool:
    return (str(node.attr("mode", "nearest")) != "nearest"
            and ctx.info(node, node.input(0)).dtype.is_quantized)


def _integer_resize(b: _Builder) -> None:
    """A linear Resize of u8/s8 data (QOperator models resize quantized tensors directly):
    onnxruntime interpolates in float32 and converts with ``static_cast``, i.e. truncates
    toward zero (measured: 100 % equal to ``trunc`` of its float Resize, 0.5 % for ``rint``).
    Written as ``Cast_T(Resize(Cast_f32(x)))``; ONNX Cast truncates toward zero too."""
    n = b.node
    dtype = b.ctx.info(n, n.input(0)).dtype
    x = b.add("Cast", [n.input(0)], to=TensorProto.FLOAT)
    y = b.add("Resize", [x, *n.inputs[1:]], name=n.name, **n.attrs)
    to = TensorProto.UINT8 if dtype.np == np.uint8 else TensorProto.INT8
    b.add("Cast", [y], n.outputs[0], b.fresh("Cast"), to=to)


# Standard ops that QOperator models apply to u8/s8 tensors directly and whose QDQ form keeps
# the input's scale and zero point on the output (what quantize_static writes in QDQ format).
_PRESERVING = frozenset({"MaxPool", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze",
                         "Split", "Slice", "Resize", "Identity", "Pad"})


def _requantizable(ctx: Context, node: NodeView) -> bool:
    if not node.input(0) or ctx.is_const(node.input(0)):
        return False
    info = ctx.info(node, node.input(0))
    if not info.dtype.is_quantized or info.quant is None or not info.quant.per_tensor:
        return False
    if node.op_type == "Resize":
        return str(node.attr("mode", "nearest")) == "nearest"
    if node.op_type == "Pad":
        return not (node.input(2) and not ctx.is_const(node.input(2)))
    return True


def _requantized(b: _Builder) -> None:
    """``op(x_q) = Q(op(DQ(x_q)))`` with x's scale and zero point, for ops that only move or
    select values (exact: ``Q(DQ(v)) = v`` for every integer level v, and max commutes with
    the increasing DQ). Pad's integer constant c becomes ``(c - zp)·s`` (absent: c = 0)."""
    n, ctx = b.node, b.ctx
    quant = ctx.info(n, n.input(0)).quant
    assert quant is not None
    dtype = ctx.info(n, n.input(0)).dtype.np
    scale = b.const("scale", np.asarray(quant.scale_array(), np.float32).reshape(()))
    zp = b.const("zero_point", np.asarray(quant.zero_point_array()).astype(dtype).reshape(()))
    inputs = [b.dq(n.input(0), scale, zp, "x"), *n.inputs[1:]]
    if n.op_type == "Pad" and str(n.attr("mode", "constant")) == "constant":
        c = ctx.consts[n.input(2)] if n.input(2) else np.zeros((), dtype)
        level = int(np.asarray(c).reshape(-1)[0]) - int(quant.zero_point_array().reshape(-1)[0])
        real = np.float32(level) * quant.scale_array().reshape(-1)[0]
        inputs = [inputs[0], n.input(1), b.const("pad_value", np.asarray(real, np.float32)),
                  *n.inputs[3:]]
    outs = [b.fresh(f"out{i}_f32") if o else "" for i, o in enumerate(n.outputs)]
    b.add(n.op_type, inputs, outs, n.name, **n.attrs)
    for out, y in zip(n.outputs, outs, strict=True):
        if out:
            b.q(y, scale, zp, out)


_RULES = {
    ("", "Resize"): _integer_resize,
    ("", "QLinearConv"): _qlinear_conv,
    ("", "QLinearMatMul"): _qlinear_matmul,
    ("", "ConvInteger"): _INTEGER_RULES["ConvInteger"],
    ("", "MatMulInteger"): _INTEGER_RULES["MatMulInteger"],
    (MS_DOMAIN, "QGemm"): _qgemm,
    (MS_DOMAIN, "DynamicQuantizeMatMul"): _dynamic_quantize_matmul,
    (MS_DOMAIN, "MatMulIntegerToFloat"): _matmul_integer_to_float,
    (MS_DOMAIN, "QLinearAdd"): _binary("Add"),
    (MS_DOMAIN, "QLinearMul"): _binary("Mul"),
    (MS_DOMAIN, "QLinearConcat"): _qlinear_concat,
    (MS_DOMAIN, "QLinearAveragePool"): _pool("AveragePool"),
    (MS_DOMAIN, "QLinearGlobalAveragePool"): _pool("GlobalAveragePool"),
    (MS_DOMAIN, "QLinearSigmoid"): _unary("Sigmoid"),
    (MS_DOMAIN, "QLinearLeakyRelu"): _unary("LeakyRelu", ("alpha",)),
    (MS_DOMAIN, "QLinearSoftmax"): _qlinear_softmax,
}
