"""QuantizeLinear, DequantizeLinear and OpenVINO's FakeQuantize.

ONNX Q/DQ: ``q = saturate(round_half_even(x / s) + zp)``, ``x' = (q - zp) · s``. Accepted:
u8/s8 (and s32 for DequantizeLinear, ONNX Runtime's bias), per tensor or per axis, scale a
float32 constant that is > 0 (not NaN), zero point a constant of the quantized type within
its range. A scale outside [MIN_SCALE, MAX_SCALE] (passes/quant_utils.py) is valid ONNX that
qfuse's int8 kernels cannot compute exactly. A finite one above MAX_SCALE on a QuantizeLinear
read only by DequantizeLinear nodes of its parameters is the pair computed in float32, as the
16-bit pairs below (``_float_pair``): quantize_static gives the masked attention scores of a
BERT-style encoder, whose mask holds float32's lowest value, the scale FLT_MAX/255. Any other
such node runs as a float island (onnxruntime). That includes +inf, which quantize_static
writes for a tensor holding -inf (a GPT-style causal mask `Where(cond, 0, -inf)`): its
DequantizeLinear gives what onnxruntime gives. ``saturate`` (opset 19+)
only concerns float8 types and is ignored. 16-bit activations are float fake quantization and
4-bit weights are read as 8-bit ones (SIXTEEN_BIT, WIDENED_4BIT below); onnxruntime's
com.microsoft QuantizeLinear / DequantizeLinear are these ops (context.py, CONTRIB_QDQ).
Blocked quantization (opset 21 ``block_size``), float8 types and 4-bit activations are
refused (float islands).

A QuantizeLinear on a constant is folded into an integer constant carrying its QuantParams;
a DequantizeLinear on an integer constant stays a node and the constant's TensorInfo gets the
QuantParams (ONNX Runtime's quantizer stores weights and biases that way; the passes need the
integer data and its scales, not a float copy).
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from qfuse.compiler.errors import MalformedModelError, UnsupportedModelError
from qfuse.compiler.onnx_import.context import (
    DEFAULT_DOMAINS,
    DEQUANTIZED_PORTS,
    ONNX_TO_DTYPE,
    Context,
    NodeView,
    dtype_onnx_name,
    onnx_type_name,
)
from qfuse.compiler.onnx_import.folding import evaluate
from qfuse.ir.ops import DequantizeAttrs, FakeQuantizeAttrs, Op, QuantizeAttrs
from qfuse.ir.types import DType, OnnxQuantize, QuantParams, TensorInfo
from qfuse.passes.qdq_to_fake_quantize import qdq_ranges
from qfuse.passes.quant_utils import MAX_SCALE, MIN_SCALE, DqParams


QUANTIZED = {TensorProto.UINT8: DType.U8, TensorProto.INT8: DType.S8}
DEQUANTIZABLE = {**QUANTIZED, TensorProto.INT32: DType.S32}
# 4-bit constants (quantize_static's QInt4 / QUInt4 weights): their integers are 8-bit integers
# too, so they are read as int8 / uint8 (the same values, the same dequantized result) and
# reach the int8 kernels.
WIDENED_4BIT = {TensorProto.INT4: (TensorProto.INT8, np.int8),
                TensorProto.UINT4: (TensorProto.UINT8, np.uint8)}
# 16-bit quantization (quantize_static's QInt16 / QUInt16 activations). There are no 16-bit
# integer kernels: a QuantizeLinear whose integers only DequantizeLinear nodes of the same
# parameters read is the float fake quantization ``(saturate(rint(x/s) + zp) − zp)·s``, one
# FakeQuantize carrying the pair (``OnnxQuantize``, exact), which the passes fuse into the
# float kernels around it; a 16-bit constant is dequantized at import.
SIXTEEN_BIT = {TensorProto.INT16: DType.S16, TensorProto.UINT16: DType.U16}


def centered_weights(w: np.ndarray, zero_point: np.ndarray | None, axis: int) -> np.ndarray:
    """``w - zp`` as int32 (exact for 8-bit operands), the zero point per tensor or 1-D along
    ``axis`` of ``w``; an absent zero point is 0."""
    zp = np.zeros((), np.int64) if zero_point is None else np.asarray(zero_point)
    shape = () if zp.size == 1 else [-1 if i == axis % w.ndim else 1 for i in range(w.ndim)]
    return (w.astype(np.int64) - zp.astype(np.int64).reshape(shape)).astype(np.int32)


def as_int8(centered: np.ndarray) -> np.ndarray | None:
    """``centered`` as s8 when every value fits, else None."""
    if centered.min(initial=0) >= -128 and centered.max(initial=0) <= 127:
        return centered.astype(np.int8)
    return None


def _elem_type(ctx: Context, node: NodeView, name: str) -> int:
    """ONNX element type of value ``name``."""
    if ctx.is_const(name):
        try:
            return int(helper.np_dtype_to_tensor_dtype(ctx.consts[name].dtype))
        except (KeyError, ValueError, TypeError):
            return TensorProto.UNDEFINED
    dtype = ctx.info(node, name).dtype
    return next((k for k, v in ONNX_TO_DTYPE.items() if v is dtype), TensorProto.UNDEFINED)



def _check_zero_point(ctx: Context, node: NodeView, qtype: int) -> None:
    """Zero point (if any) within the quantized type's range and of that type."""
    name = node.input(2)
    if not name:
        return
    zp = ctx.const(node, 2, "zero point")
    low, high = ONNX_TO_DTYPE[qtype].range
    if zp.dtype.kind in "iub" and zp.size and (int(zp.min()) < low or int(zp.max()) > high):
        bad = int(zp.min()) if int(zp.min()) < low else int(zp.max())
        raise ctx.malformed(node, f"zero point {bad} is outside the {onnx_type_name(qtype)} "
                                  f"range [{low}, {high}]")
    zp_type = _elem_type(ctx, node, name)
    if zp_type != qtype:
        raise ctx.malformed(node, f"zero point type {onnx_type_name(zp_type)} differs from the "
                                  f"quantized type {onnx_type_name(qtype)}")


def _params(ctx: Context, node: NodeView, x: TensorInfo, *, kernel_scale: bool = True,
            float_pair: bool = False) -> tuple[QuantParams, int]:
    """Validated QuantParams and the (non-negative) axis attribute. ``kernel_scale``: the
    scale reaches the int8 kernels (an INT32 bias is dequantized once, in numpy, instead);
    ``float_pair``: a finite scale above MAX_SCALE is accepted, the caller computing the
    pair in float32 (``_float_pair``)."""
    if node.attr("block_size", 0):
        raise ctx.unsupported(node, f"blocked quantization (block_size="
                                    f"{node.attr('block_size')}) is not supported")
    scale = ctx.const(node, 1, "scale")
    if scale.dtype != np.float32:
        raise ctx.unsupported(node, f"scale of type {scale.dtype} is not supported (want "
                                    f"float32)")
    if scale.ndim > 1 and ctx.opset >= 21:  # blocked quantization's N-D scales
        raise ctx.unsupported(node, f"scale of shape {scale.shape} is not supported (want a "
                                    f"scalar or a 1-D per-axis scale)")
    if scale.ndim > 1 or scale.size == 0:
        raise ctx.malformed(node, f"scale of shape {scale.shape}: ONNX wants a scalar or a "
                                  f"non-empty 1-D per-axis scale")
    if np.any(np.isnan(scale)):
        raise ctx.malformed(node, f"scale must be a number, got {_show(scale)}")
    if np.any(scale <= 0):
        raise ctx.malformed(node, f"scale must be > 0, got {_show(scale)}")
    # +inf too: quantize_static writes it for a tensor holding -inf (a causal attention mask)
    huge = np.any(scale > MAX_SCALE) and not (float_pair and np.all(np.isfinite(scale)))
    if huge or (kernel_scale and np.any(scale < MIN_SCALE)):
        bad = float(scale.min()) if np.any(scale < MIN_SCALE) else float(scale.max())
        raise ctx.unsupported(node, f"scale {bad:.3g} is outside the range qfuse computes "
                                    f"exactly, [{MIN_SCALE:.3g}, {MAX_SCALE:.3g}]")
    zp = ctx.optional_const(node, 2, "zero point")
    zp = np.zeros(scale.shape, np.int64) if zp is None else zp
    if zp.size != scale.size:
        raise ctx.malformed(node, f"zero point of shape {zp.shape} does not match the scale's "
                                  f"{scale.shape}")
    zp = zp.reshape(scale.shape)  # ONNX Runtime pairs a (1,) scale with a scalar zero point
    axis = int(node.attr("axis", 1))
    per_axis = scale.ndim == 1 and scale.size > 1
    if not -x.rank <= axis < x.rank:
        if per_axis:
            raise ctx.malformed(node, f"axis {axis} is out of range for rank {x.rank}")
        axis = 0  # ignored by a per-tensor (de)quantization
    axis = axis % x.rank if x.rank else 0
    if per_axis and scale.size != x.shape[axis]:
        raise ctx.malformed(node, f"{scale.size} scales for {x.shape[axis]} channels on axis "
                                  f"{axis}")
    if per_axis:
        return QuantParams.make(scale, zp.astype(np.int64), axis), axis
    return QuantParams.make(scale.reshape(()), zp.astype(np.int64).reshape(())), axis


def _show(values: np.ndarray) -> str:
    flat = values.ravel()
    bad = flat[~np.isfinite(flat) | (flat <= 0)] if flat.dtype.kind == "f" else flat
    return str(bad[0]) if bad.size else str(flat[:4])


def quantize_linear(ctx: Context, node: NodeView) -> None:
    zp_name = node.input(2)
    attr_type = int(node.attr("output_dtype", 0))
    zp_type = _elem_type(ctx, node, zp_name) if zp_name else 0
    qtype = attr_type or zp_type or TensorProto.UINT8
    if qtype not in QUANTIZED and qtype not in SIXTEEN_BIT:
        raise ctx.unsupported(node, f"quantized type {onnx_type_name(qtype)} is not supported "
                                    f"(only UINT8 and INT8, and INT16 / UINT16 read only by "
                                    f"DequantizeLinear)")
    x = ctx.input_info(node, 0)
    if x.dtype is not DType.F32:
        raise ctx.unsupported(node, f"quantizing a {dtype_onnx_name(x.dtype)} tensor is not "
                                    f"supported (only FLOAT)")
    _check_zero_point(ctx, node, qtype)
    runtime = not ctx.is_const(node.input(0))
    quant, axis = _params(ctx, node, x, float_pair=runtime)
    if not runtime:
        ctx.set_const(node.outputs[0], evaluate(ctx, node)[0], quant)
        return
    if qtype in SIXTEEN_BIT:
        _float_pair(ctx, node, qtype, quant, x,
                    f"16-bit quantization ({onnx_type_name(qtype)})",
                    "qfuse has no 16-bit integer kernels")
        return
    if max(quant.scale) > MAX_SCALE:
        _float_pair(ctx, node, qtype, quant, x,
                    f"scale {max(quant.scale):.3g} is above {MAX_SCALE:.3g}, where qfuse's "
                    f"int8 kernels overflow float32, and the QuantizeLinear",
                    "only a pair of a QuantizeLinear and its DequantizeLinear readers runs in "
                    "float32")
        return
    ctx.emit(node, Op.QUANTIZE_LINEAR, node.inputs[:3],
             QuantizeAttrs(QUANTIZED[qtype], axis))


def _check_opset(ctx: Context, node: NodeView, qtype: int) -> None:
    """16- and 4-bit types in ONNX's own QuantizeLinear / DequantizeLinear need opset 21
    (onnxruntime's contrib ops take them at any opset)."""
    contrib = node.proto is not None and node.proto.domain not in DEFAULT_DOMAINS
    if not contrib and ctx.opset < 21:
        raise ctx.malformed(node, f"type {onnx_type_name(qtype)} needs opset 21 (the model's "
                                  f"is {ctx.opset}) or onnxruntime's com.microsoft "
                                  f"{node.op_type}")


def _float_pair(ctx: Context, node: NodeView, qtype: int, quant: QuantParams, x: TensorInfo,
                what: str, because: str) -> None:
    """A QuantizeLinear of run-time ``x`` and its DequantizeLinear readers as one FakeQuantize
    standing for the pair, ``(saturate(rint(x/s) + zp) − zp)·s`` in float32 (the passes fuse
    it into the float kernels around it, compiler/lower/lower_gate.py): 16-bit quantization
    (SIXTEEN_BIT) and a scale above MAX_SCALE (quantize_static's for a tensor holding
    float32's lowest value, a masked attention score: FLT_MAX/255). An island, ``what`` and
    ``because`` saying why, when some reader is not such a DequantizeLinear."""
    why = _not_paired(ctx, node, quant, x)
    if why is not None:
        raise ctx.unsupported(node, f"{what} {why}; {because}")
    if qtype in SIXTEEN_BIT:
        _check_opset(ctx, node, qtype)
    dtype = SIXTEEN_BIT.get(qtype) or QUANTIZED[qtype]
    qmin, qmax = dtype.range
    with np.errstate(over="ignore"):  # s·(qmin − zp) may round past float32's largest
        low, high = qdq_ranges(DqParams(quant.scale_array(), quant.zero_point_array(),
                                        quant.axis, dtype), x.rank)
    ranges = [ctx.constant(node, tag, values)
              for tag, values in (("il", low), ("ih", high), ("ol", low), ("oh", high))]
    ctx.emit(node, Op.FAKE_QUANTIZE, [node.input(0), *ranges],
             FakeQuantizeAttrs(qmax - qmin + 1, OnnxQuantize(dtype, quant)))
    ctx.fake_quantized.add(node.outputs[0])


def _not_paired(ctx: Context, node: NodeView, quant: QuantParams, x: TensorInfo
                ) -> str | None:
    """Why the readers of ``node``'s integers are not all DequantizeLinear nodes with its
    parameters (or QOperator ops reading them through one: DEQUANTIZED_PORTS), or None when
    they are."""
    out = node.outputs[0]
    if out in ctx.graph_outputs:
        return "writes a graph output"
    for reader in ctx.readers.get(out, []):
        dequantizes = _dequantizes(reader, out)
        if dequantizes is None:
            return f"is read by {reader}, not only by DequantizeLinear"
        for dq in dequantizes:
            try:
                theirs, _ = _params(ctx, dq, x, float_pair=True)
            except (UnsupportedModelError, MalformedModelError) as exc:
                return f"is read by {reader}, whose parameters it cannot compare ({exc})"
            if theirs != quant:
                return f"is read by {reader}, whose scale or zero point differ"
    return None


def _dequantizes(reader: NodeView, value: str) -> list[NodeView] | None:
    """The DequantizeLinear nodes through which ``reader`` reads ``value`` (itself, or one per
    port of a QOperator op's rewrite), None when it reads it otherwise."""
    domain = "" if reader.domain in DEFAULT_DOMAINS else reader.domain
    if reader.op_type == "DequantizeLinear" and not domain:
        if reader.inputs[0] != value or value in reader.inputs[1:]:
            return None
        return [reader]
    ports = DEQUANTIZED_PORTS.get((domain, reader.op_type), ())
    taken = {x for x, _, _ in ports if reader.input(x) == value}
    if not taken or any(v == value for i, v in enumerate(reader.inputs) if i not in taken):
        return None
    return [NodeView.from_proto(helper.make_node(
        "DequantizeLinear", [reader.input(x), reader.input(s), reader.input(z)], []),
        f"{reader.name}/input {x}") for x, s, z in ports if x in taken]


def dequantize_linear(ctx: Context, node: NodeView) -> None:
    x_name = node.input(0)
    if x_name in ctx.fake_quantized:  # its 16-bit QuantizeLinear wrote (q − zp)·s already
        ctx.emit(node, Op.IDENTITY, [x_name])
        return
    qtype = _elem_type(ctx, node, x_name)
    if ctx.is_const(x_name) and (qtype in WIDENED_4BIT or qtype in SIXTEEN_BIT):
        _check_opset(ctx, node, qtype)
    if ctx.is_const(x_name) and qtype in WIDENED_4BIT:
        qtype = _widen_4bit(ctx, node, qtype)
    if ctx.is_const(x_name) and qtype in SIXTEEN_BIT:  # checked, then folded as ONNX says
        _check_zero_point(ctx, node, qtype)
        _params(ctx, node, ctx.input_info(node, 0), kernel_scale=False)
        ctx.set_const(node.outputs[0], evaluate(ctx, node)[0])
        return
    if qtype not in DEQUANTIZABLE:
        raise ctx.unsupported(node, f"dequantizing type {onnx_type_name(qtype)} is not "
                                    f"supported (only UINT8, INT8 and INT32)")
    x = ctx.input_info(node, 0)
    _check_zero_point(ctx, node, qtype)
    # ONNX Runtime's int32 bias has scale s_x·s_w, often below the smallest normal float32
    quant, axis = _params(ctx, node, x, kernel_scale=qtype != TensorProto.INT32)
    if qtype == TensorProto.INT32 and any(quant.zero_point):
        raise ctx.malformed(node, "an INT32 input must have zero point 0")
    inputs = list(node.inputs[:3])
    if ctx.is_const(x_name):
        inputs[0] = ctx.materialize(node, x_name, quant)
    ctx.emit(node, Op.DEQUANTIZE_LINEAR, inputs, DequantizeAttrs(axis))


def _widen_4bit(ctx: Context, node: NodeView, qtype: int) -> int:
    """The 4-bit constant data and zero point of ``node`` as 8-bit (WIDENED_4BIT); the type."""
    wide, np_type = WIDENED_4BIT[qtype]
    for name in (node.input(0), node.input(2)):
        if name and ctx.is_const(name) and _elem_type(ctx, node, name) == qtype:
            ctx.consts[name] = ctx.consts[name].astype(np_type)
    return wide


def fake_quantize(ctx: Context, node: NodeView) -> None:
    """OpenVINO's FakeQuantize (as NNCF exports it): levels, auto_broadcast."""
    levels = node.attr("levels")
    if not isinstance(levels, int) or levels < 2:
        raise ctx.malformed(node, f"levels must be an integer >= 2, got {levels!r}")
    broadcast = str(node.attr("auto_broadcast", "numpy")).lower()
    if broadcast not in ("numpy", "none"):
        raise ctx.unsupported(node, f"auto_broadcast '{broadcast}' is not supported")
    if len(node.inputs) != 5:
        raise ctx.malformed(node, f"FakeQuantize takes 5 inputs, got {len(node.inputs)}")
    x = ctx.input_info(node, 0)
    if x.dtype is not DType.F32:
        raise ctx.unsupported(node, f"FakeQuantize on {dtype_onnx_name(x.dtype)} is not "
                                    f"supported (only FLOAT)")
    names = ("input_low", "input_high", "output_low", "output_high")
    for port, what in enumerate(names, 1):
        bound = ctx.const(node, port, what)
        if bound.dtype.kind != "f" or not np.all(np.isfinite(bound)):
            raise ctx.malformed(node, f"{what} must be finite floats")
        if broadcast == "none" and bound.shape != x.shape:
            raise ctx.malformed(node, f"{what} of shape {bound.shape} needs shape {x.shape} "
                                      f"with auto_broadcast 'none'")
    ctx.emit(node, Op.FAKE_QUANTIZE, node.inputs, FakeQuantizeAttrs(levels))
