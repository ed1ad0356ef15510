"""Constant folding at import time.

A node of the default domain whose inputs are all constants is evaluated with
onnx.reference.ReferenceEvaluator (at the model's opset) and its outputs become constants.
Shape and Size need no constant input: every value has a static shape, so they always fold.
This turns the Shape -> Gather -> Unsqueeze -> Concat -> Reshape chains exporters write into
static attributes, and evaluates Erf/Sqrt/Pow/Range/Where/Expand/... on constants even though
the IR has no such ops.

Not folded: DequantizeLinear (an integer weight and its scale must reach the passes as they
are), QuantizeLinear (its converter folds it and records the QuantParams of the result),
nondeterministic ops and control flow (an If whose condition folds is replaced by the branch it
takes: ``_inline_if`` in __init__.py).
"""

from __future__ import annotations

import logging
import math

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from qfuse.compiler.onnx_import.context import CONTRIB_QDQ, DEFAULT_DOMAINS, Context, NodeView
from qfuse.ir.limits import check_bytes, check_shape, element_count

logger = logging.getLogger(__name__)

NOT_FOLDED = frozenset({
    "DequantizeLinear", "QuantizeLinear", "RandomNormal", "RandomNormalLike", "RandomUniform",
    "RandomUniformLike", "Multinomial", "Bernoulli", "If", "Loop", "Scan",
})
ALWAYS_FOLDED = frozenset({"Shape", "Size"})
_CONSTANT_SCALARS = {
    "value_float": np.float32, "value_int": np.int64,
    "value_floats": np.float32, "value_ints": np.int64,
}


def foldable(ctx: Context, node: NodeView) -> bool:
    if node.proto is None or node.domain not in DEFAULT_DOMAINS:
        return False
    if node.op_type in ALWAYS_FOLDED or node.op_type == "Constant":
        return True
    if _zero_product(ctx, node) is not None:
        return True
    if node.op_type in NOT_FOLDED or not any(node.inputs):
        return False
    return all(ctx.is_const(name) for name in node.inputs if name)


def fold(ctx: Context, node: NodeView) -> None:
    """Evaluate ``node`` (``foldable`` said yes) and record its outputs as constants."""
    zeros = _zero_product(ctx, node)
    if zeros is not None:
        outputs = [np.zeros(*zeros)]
    elif node.op_type == "Constant":
        outputs = [constant_value(ctx, node)]
    elif node.op_type in ALWAYS_FOLDED:
        outputs = [_shape_or_size(ctx, node)]
    else:
        outputs = evaluate(ctx, node)
    for name, value in zip(node.outputs, outputs, strict=False):
        if name:
            ctx.set_const(name, np.asarray(value))
    logger.debug("folded %s", node)


def _zero_product(ctx: Context, node: NodeView) -> tuple[tuple[int, ...], np.dtype] | None:
    """(shape, dtype) of the zeros a Mul of an integer tensor by a constant of zeros gives
    (exact: integers hold no NaN or infinity) — an exporter's way to keep an input alive
    (silero-vad's ``sr·0``, added to its state): the chain after it folds instead of running
    on the host every run. None for any other node."""
    names = [n for n in node.inputs if n]
    if node.op_type != "Mul" or len(names) != 2 or node.domain not in DEFAULT_DOMAINS:
        return None
    zero = next((n for n in names if ctx.is_const(n) and not np.any(ctx.consts[n])), None)
    if zero is None or np.asarray(ctx.consts[zero]).dtype.kind not in "iu":
        return None
    other = names[1] if zero == names[0] else names[0]
    if not ctx.is_const(other) and other not in ctx.graph.values:
        return None  # read before any node makes it: the converter names it
    info = ctx.info(node, other)
    const = np.asarray(ctx.consts[zero])
    if info.dtype.np.kind not in "iu":
        return None
    return (np.broadcast_shapes(tuple(info.shape), const.shape),
            np.result_type(info.dtype.np, const.dtype))


def evaluate(ctx: Context, node: NodeView) -> list[np.ndarray]:
    assert node.proto is not None
    feeds = {name: ctx.consts[name] for name in node.inputs if name}
    _check_result_size(node, feeds)
    proto = node.proto
    if (proto.domain, proto.op_type) in CONTRIB_QDQ:  # the ONNX op's formula (context.py)
        proto = onnx.NodeProto()
        proto.CopyFrom(node.proto)
        proto.domain = ""
    try:
        evaluator = ReferenceEvaluator(proto, opsets={"": ctx.opset})
        results = evaluator.run(None, feeds)
    except Exception as exc:  # any evaluator failure is reported on the node
        raise ctx.unsupported(
            node, f"cannot fold this op on constant inputs ({type(exc).__name__}: {exc}); it "
                  f"is otherwise not supported"
        ) from exc
    return [np.asarray(r) for r in results]


# Ops whose result can be far larger than their inputs, and the element count of that result
# computed from the inputs alone (onnx.reference would allocate it first).
_ELEMENTWISE = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Sum", "Mean", "Where", "Equal",
    "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor", "BitShift",
    "PRelu", "BitwiseAnd", "BitwiseOr", "BitwiseXor",
})


def _result_elements(node: NodeView, feeds: dict[str, np.ndarray]) -> int | None:
    """An upper bound of the largest output's element count, when it may exceed the inputs'."""
    values = [feeds.get(name) for name in node.inputs]
    op = node.op_type
    try:
        if op == "ConstantOfShape":
            return element_count(values[0].reshape(-1).tolist())
        if op == "Expand":
            shape = values[1].reshape(-1).tolist()
            rank = max(values[0].ndim, len(shape))
            a = [1] * (rank - values[0].ndim) + list(values[0].shape)
            b = [1] * (rank - len(shape)) + [int(d) for d in shape]
            return element_count(max(x, y) for x, y in zip(a, b, strict=True))
        if op == "Tile":
            return values[0].size * element_count(values[1].reshape(-1).tolist())
        if op == "Range":
            start, limit, delta = (float(v.reshape(-1)[0]) for v in values[:3])
            steps = (limit - start) / delta if delta else float("inf")
            return int(min(max(math.ceil(steps), 0), 2**62)) if math.isfinite(steps) else 2**62
        if op in ("Pad", "Resize", "Upsample", "OneHot"):
            return None if op == "OneHot" else _grown_by_attrs(op, values)
        if op in _ELEMENTWISE:
            shapes = [v.shape for v in values if v is not None]
            rank = max(len(s) for s in shapes)
            padded = [[1] * (rank - len(s)) + list(s) for s in shapes]
            return element_count(max(dims) for dims in zip(*padded, strict=True))
        if op == "MatMul" and min(values[0].ndim, values[1].ndim) >= 2:
            a, b = values[0].shape, values[1].shape
            batch = np.broadcast_shapes(a[:-2], b[:-2])
            return element_count([*batch, a[-2], b[-1]])
        if op == "Gemm":
            a, b = values[0].shape, values[1].shape
            return (a[0] if not node.attr("transA", 0) else a[1]) * (
                b[1] if not node.attr("transB", 0) else b[0])
    except (AttributeError, IndexError, TypeError, ValueError, OverflowError):
        return None  # malformed inputs: the evaluator reports them
    return None


def _grown_by_attrs(op: str, values: list[np.ndarray | None]) -> int | None:
    x = values[0]
    if x is None:
        return None
    if op == "Pad" and len(values) > 1 and values[1] is not None:
        pads = [int(p) for p in values[1].reshape(-1)]
        if len(pads) == 2 * x.ndim:
            return element_count(d + max(pads[i], 0) + max(pads[i + x.ndim], 0)
                                 for i, d in enumerate(x.shape))
    if op in ("Resize", "Upsample"):
        sizes = values[3] if len(values) > 3 else None
        scales = values[2] if op == "Resize" and len(values) > 2 else (
            values[1] if op == "Upsample" and len(values) > 1 else None)
        if sizes is not None and sizes.size:
            return element_count(sizes.reshape(-1).tolist())
        if scales is not None and scales.size == x.ndim:
            grown = [float(s) * d for s, d in zip(scales.reshape(-1), x.shape, strict=True)]
            if not all(math.isfinite(g) for g in grown):
                return 2**62
            return element_count(math.ceil(max(g, 0.0)) for g in grown)
    return None


def _check_result_size(node: NodeView, feeds: dict[str, np.ndarray]) -> None:
    elements = _result_elements(node, feeds)
    if elements is not None:
        check_bytes(f"node {node}: folding it on constants", elements * 8)


def _shape_or_size(ctx: Context, node: NodeView) -> np.ndarray:
    shape = ctx.input_info(node, 0).shape
    if node.op_type == "Size":
        return np.array(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)
    rank = len(shape)
    start = node.attr("start", 0)
    end = node.attr("end", rank)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    return np.array(shape[start:end], dtype=np.int64)


def sparse_to_dense(sparse: onnx.SparseTensorProto) -> np.ndarray:
    """A SparseTensorProto as a dense array (indices linear [NNZ] or per dim [NNZ, rank])."""
    check_shape(f"sparse tensor '{sparse.values.name}' (dense)", sparse.dims,
                np.dtype(helper.tensor_dtype_to_np_dtype(sparse.values.data_type)).itemsize)
    values = numpy_helper.to_array(sparse.values)
    indices = numpy_helper.to_array(sparse.indices).astype(np.int64)
    dense = np.zeros(tuple(sparse.dims), dtype=values.dtype)
    if indices.ndim == 1:
        dense.reshape(-1)[indices] = values
    else:
        dense[tuple(indices.T)] = values
    return dense


def constant_value(ctx: Context, node: NodeView) -> np.ndarray:
    """The value of a Constant node, whatever attribute holds it."""
    if len(node.attrs) != 1:
        raise ctx.malformed(node, f"Constant needs exactly one value attribute, got "
                                  f"{sorted(node.attrs)}")
    key, value = next(iter(node.attrs.items()))
    if key == "value":
        return numpy_helper.to_array(value)
    if key == "sparse_value":
        return sparse_to_dense(value)
    if key in _CONSTANT_SCALARS:
        return np.array(value, dtype=_CONSTANT_SCALARS[key])
    raise ctx.unsupported(node, f"Constant with attribute '{key}' is not supported")
