"""Exact QDQ for a QOperator model: its integer-product ops written as DequantizeLinear →
float op → QuantizeLinear, for ONNX Runtime to run with ORT_DISABLE_ALL as the reference.

Why. ONNX Runtime runs a QOperator model's QLinearConv, QLinearMatMul and QGemm with MLAS's
int8 GEMM kernels whatever the optimization level, and on x86 CPUs without VNNI those use
``vpmaddubsw``, which adds the u8·s8 products of two adjacent channels in int16 with
saturation (onnxruntime's quantization docs, "When and why do I need to try U8U8?":
"this instruction might suffer from saturation issues"). So ORT_DISABLE_ALL does not compute
a QOperator model's meaning on such a CPU: on the zoo's AVX2 machine the first QLinearConv of
PP-OCRv4 rec, fed ORT's own quantized input, is 36 LSB off the exact integer convolution on
19 % of its outputs (``tests/examples/test_realzoo_exact.py``). The op's meaning (ONNX spec,
onnxruntime's contrib op schemas) is the exact integer sum requantized, which the QDQ form
computes in float32 exactly as a QDQ model's reference does:

    QLinearConv(x, sx, zx, w, sw, zw, sy, zy, B)  = Q(Conv(DQ(x), DQ(w; axis 0), DQ(B; sx·sw)))
    QLinearMatMul(a, sa, za, b, sb, zb, sy, zy)   = Q(MatMul(DQ(a), DQ(b; last axis)))
    QGemm(A, sa, za, B, sb, zb, C, sy, zy; alpha) = Q(Gemm(DQ(A), DQ(B), DQ(C; alpha·sa·sb)))
    QLinearAdd / QLinearMul(A, sA, zA, B, sB, zB, sC, zC) = Q(DQ(A) + DQ(B)), Q(DQ(A)·DQ(B))
    MatMulInteger / ConvInteger(x, w, zx, zw)     = Cast_int32(op(DQ(x; 1, zx), DQ(w; 1, zw)))

(MatMulInteger and ConvInteger, quantize_dynamic's ops, run on the same saturating MLAS
kernels. Their float form is exact while every partial sum stays below 2^24 in magnitude —
255·128·K for K ≤ 514 taps whatever the data; the convolution's padding is 0 after the
DequantizeLinear, i.e. x padded with zx, as ONNX Runtime's ConvInteger pads.)

(QLinearAdd: MLAS adds ``a·(sA/sC) + b·(sB/sC) + bias`` with the ratios rounded to float32,
which puts exact ties of the real sum on either side: on PP-OCRv4 rec, fed the same inputs, 11
of its 98 QLinearAdds are 1 LSB off the QDQ form on up to 4.6 % of their outputs.)

A constant operand with a per-axis scale is dequantized here in numpy, ``f32(w - zw)·f32(sw)``,
ONNX's DequantizeLinear formula (so the model keeps its opset: per-axis DequantizeLinear needs
13, PP-OCR's models are 11 and 12). Every other node — QLinearAdd, QLinearMul, the pools,
QLinearSigmoid, QLinearSoftmax, ... — stays as written: ORT computes those in float per their
schema, with no int16 step.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper
from onnx import numpy_helper as nh

MS_DOMAIN = "com.microsoft"
# Bump when the rewrite changes (the cached reference outputs are keyed on it).
EXACT_VERSION = "3"


class _Rewrite:
    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.consts = {t.name: nh.to_array(t) for t in model.graph.initializer}
        self.nodes: list[onnx.NodeProto] = []
        self.used = {o for n in model.graph.node for o in (*n.input, *n.output)} | set(self.consts)

    def fresh(self, base: str) -> str:
        name, i = base, 1
        while name in self.used:
            name, i = f"{base}_{i}", i + 1
        self.used.add(name)
        return name

    def const(self, base: str, value: np.ndarray) -> str:
        name = self.fresh(base)
        self.model.graph.initializer.append(nh.from_array(value, name))
        self.consts[name] = value
        return name

    def node(self, op: str, inputs: list[str], output: str | None, name: str,
             **attrs: object) -> str:
        output = output or self.fresh(f"{name}/{op}_out")
        self.nodes.append(helper.make_node(op, inputs, [output], name=self.fresh(f"{name}/{op}"),
                                           **attrs))
        return output

    def dq(self, node: onnx.NodeProto, x: str, scale: str, zp: str, axis: int,
           what: str) -> str:
        """DequantizeLinear of ``x``: a node when the scale is per tensor, else (a constant
        per-axis operand) a float initializer computed with ONNX's formula."""
        s = self.consts.get(scale)
        if s is not None and s.size > 1 or (zp and zp in self.consts
                                            and self.consts[zp].size > 1):
            if x not in self.consts or s is None or (zp and zp not in self.consts):
                raise ValueError(f"node {node.name!r} ({node.op_type}): per-axis {what} that "
                                 f"is not a constant")
            w = self.consts[x]
            shape = [-1 if i == axis % w.ndim else 1 for i in range(w.ndim)]
            z = self.consts[zp].astype(np.int64).reshape(shape) if zp else 0
            real = (w.astype(np.int64) - z).astype(np.float32) * s.astype(np.float32).reshape(
                shape if s.size > 1 else ())
            return self.const(f"{node.name}/{what}_f32", real.astype(np.float32))
        inputs = [x, scale, zp] if zp else [x, scale]
        return self.node("DequantizeLinear", inputs, None, node.name)

    def bias(self, node: onnx.NodeProto, b: str, scale: np.ndarray) -> str:
        """DQ of an int32 bias at ``scale`` (the product of constant scales), folded."""
        if b not in self.consts:
            raise ValueError(f"node {node.name!r} ({node.op_type}): a bias that is not a "
                             f"constant")
        real = self.consts[b].astype(np.float32) * np.asarray(scale, np.float32).reshape(-1)
        return self.const(f"{node.name}/bias_f32", real.astype(np.float32))

    def scale(self, node: onnx.NodeProto, name: str) -> np.ndarray:
        if name not in self.consts:
            raise ValueError(f"node {node.name!r} ({node.op_type}): scale {name!r} is not a "
                             f"constant")
        return self.consts[name].astype(np.float32)


def _inputs(node: onnx.NodeProto, n: int) -> list[str]:
    return [*node.input, *[""] * (n - len(node.input))][:n]


def _qlinear_conv(r: _Rewrite, node: onnx.NodeProto) -> None:
    x, sx, zx, w, sw, zw, sy, zy, b = _inputs(node, 9)
    ins = [r.dq(node, x, sx, zx, 1, "x"), r.dq(node, w, sw, zw, 0, "w")]
    if b:
        ins.append(r.bias(node, b, r.scale(node, sx) * r.scale(node, sw)))
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    y = r.node("Conv", ins, None, node.name, **attrs)
    r.node("QuantizeLinear", [y, sy, zy], node.output[0], node.name)


def _qlinear_matmul(r: _Rewrite, node: onnx.NodeProto) -> None:
    a, sa, za, b, sb, zb, sy, zy = _inputs(node, 8)
    y = r.node("MatMul", [r.dq(node, a, sa, za, -1, "a"), r.dq(node, b, sb, zb, -1, "b")],
               None, node.name)
    r.node("QuantizeLinear", [y, sy, zy], node.output[0], node.name)


def _qgemm(r: _Rewrite, node: onnx.NodeProto) -> None:
    a, sa, za, b, sb, zb, c, sy, zy = _inputs(node, 9)
    attrs = {a_.name: helper.get_attribute_value(a_) for a_ in node.attribute}
    alpha, trans_b = float(attrs.get("alpha", 1.0)), int(attrs.get("transB", 0))
    ins = [r.dq(node, a, sa, za, -1, "a"), r.dq(node, b, sb, zb, 0 if trans_b else 1, "b")]
    if c:
        ins.append(r.bias(node, c, np.float32(alpha) * r.scale(node, sa) * r.scale(node, sb)))
    gemm = {"alpha": alpha, "transA": int(attrs.get("transA", 0)), "transB": trans_b}
    if not sy:
        r.node("Gemm", ins, node.output[0], node.name, **gemm)
        return
    y = r.node("Gemm", ins, None, node.name, **gemm)
    r.node("QuantizeLinear", [y, sy, zy] if zy else [y, sy], node.output[0], node.name)


def _binary(op_type: str):  # noqa: ANN202 - a rule
    def rule(r: _Rewrite, node: onnx.NodeProto) -> None:
        a, sa, za, b, sb, zb, sc, zc = _inputs(node, 8)
        y = r.node(op_type, [r.dq(node, a, sa, za, 1, "a"), r.dq(node, b, sb, zb, 1, "b")],
                   None, node.name)
        if not zc:  # absent: 0 of the input type T
            dtype = r.consts[za].dtype if za in r.consts else np.uint8
            zc = r.const(f"{node.name}/zero_point", np.zeros((), dtype))
        r.node("QuantizeLinear", [y, sc, zc], node.output[0], node.name)
    return rule


def _integer(op_type: str):  # noqa: ANN202 - a rule
    def rule(r: _Rewrite, node: onnx.NodeProto) -> None:
        x, w, zx, zw = _inputs(node, 4)
        one = r.const(f"{node.name}/unit_scale", np.array(1.0, np.float32))
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        axis = 0 if op_type == "Conv" else -1
        y = r.node(op_type, [r.dq(node, x, one, zx, 1, "x"), r.dq(node, w, one, zw, axis, "w")],
                   None, node.name, **attrs)
        r.node("Cast", [y], node.output[0], node.name, to=onnx.TensorProto.INT32)
    return rule


_RULES = {("", "QLinearConv"): _qlinear_conv, ("", "QLinearMatMul"): _qlinear_matmul,
          (MS_DOMAIN, "QGemm"): _qgemm, (MS_DOMAIN, "QLinearAdd"): _binary("Add"),
          (MS_DOMAIN, "QLinearMul"): _binary("Mul"), ("", "MatMulInteger"): _integer("MatMul"),
          ("", "ConvInteger"): _integer("Conv")}


def has_integer_products(model: onnx.ModelProto) -> bool:
    """Whether ``model`` has an op ``exact_qdq`` rewrites (one ONNX Runtime runs on its int8
    kernels, which saturate without VNNI)."""
    return any((n.domain if n.domain != "ai.onnx" else "", n.op_type) in _RULES
               for n in model.graph.node)


def exact_qdq(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with QLinearConv / QLinearMatMul / QGemm / QLinearAdd / QLinearMul
    in the QDQ form
    (module docstring); the graph's inputs, outputs and every other node are unchanged."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    r = _Rewrite(out)
    for node in model.graph.node:
        rule = _RULES.get((node.domain if node.domain != "ai.onnx" else "", node.op_type))
        if rule is None:
            r.nodes.append(node)
        else:
            rule(r, node)
    del out.graph.node[:]
    out.graph.node.extend(r.nodes)
    return out
