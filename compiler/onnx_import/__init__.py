"""ONNX → IR: ``import_model(model, input_shapes=...)``.

Steps: load (external data only from the model's folder) and check the model; make the
graph inputs with static shapes; recognize decomposed GELUs; then, per live node in order,
fold it when its inputs are constants (folding.py) or convert it with the table
``CONVERTERS`` keyed by (domain, op_type); finally infer shapes, verify and drop what no
output reads. Any failure while converting a node is re-raised as UnsupportedModelError or
MalformedModelError naming the node and its op.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qfuse.compiler.errors import (
    InputError,
    MalformedModelError,
    SizeLimitError,
    UnsupportedModelError,
)
from qfuse.compiler.onnx_import import (
    convert_dynamic,
    convert_layout,
    convert_math,
    convert_quant,
    convert_reduce,
    convert_spatial,
    folding,
    islands,
    loading,
    patterns,
    qoperator,
)
from qfuse.compiler.onnx_import.context import (
    DEFAULT_DOMAINS,
    ONNX_TO_DTYPE,
    OPENVINO_DOMAIN,
    Context,
    NodeView,
    onnx_type_name,
    symbolic_dims,
)
from qfuse.ir.graph import Graph, GraphError
from qfuse.ir.ops import LOGIC_OPS
from qfuse.ir.limits import check_shape, check_total, element_count, limits
from qfuse.ir.shapes import infer_shapes
from qfuse.ir.types import TensorInfo

logger = logging.getLogger(__name__)

Converter = Callable[[Context, NodeView], None]

_DEFAULT: dict[str, Converter] = {
    "QuantizeLinear": convert_quant.quantize_linear,
    "DequantizeLinear": convert_quant.dequantize_linear,
    "Conv": convert_spatial.conv,
    "ConvTranspose": convert_spatial.conv_transpose,
    "MaxPool": convert_spatial.max_pool,
    "AveragePool": convert_spatial.average_pool,
    "GlobalAveragePool": convert_spatial.global_average_pool,
    "GlobalMaxPool": convert_spatial.global_max_pool,
    "Resize": convert_spatial.resize,
    "Gemm": convert_math.gemm,
    "MatMul": convert_math.matmul,
    "Einsum": convert_math.einsum,
    "Add": convert_math.binary,
    "Sub": convert_math.binary,
    "Mul": convert_math.binary,
    "Div": convert_math.binary,
    "Reciprocal": convert_math.reciprocal,
    "Neg": convert_math.neg,
    "Sum": convert_math.sum_,
    "Relu": convert_math.unary,
    "Sigmoid": convert_math.unary,
    "Tanh": convert_math.unary,
    "HardSwish": convert_math.unary,
    "Identity": convert_math.unary,
    "Clip": convert_math.clip,
    "Max": convert_math.max_min,
    "Min": convert_math.max_min,
    "LeakyRelu": convert_math.leaky_relu,
    "PRelu": convert_math.prelu,
    "HardSigmoid": convert_math.hard_sigmoid,
    "Gelu": convert_math.gelu,
    "Softmax": convert_math.softmax,
    "Where": convert_math.where,
    **{op: convert_math.logic for op in LOGIC_OPS},
    "LogSoftmax": convert_math.softmax,
    "LayerNormalization": convert_math.layer_norm,
    "InstanceNormalization": convert_math.instance_norm,
    "BatchNormalization": convert_math.batch_norm,
    "Dropout": convert_math.dropout,
    **{op: convert_reduce.reduce for op in convert_reduce.REDUCE_OPS},
    "ReduceLogSum": convert_reduce.no_log_form,
    "ReduceLogSumExp": convert_reduce.no_log_form,
    "LRN": convert_reduce.lrn,
    **{op: convert_reduce.float_unary for op in convert_reduce.FLOAT_UNARY},
    "Pow": convert_reduce.power,
    "Concat": convert_layout.concat,
    "Split": convert_layout.split,
    "Slice": convert_layout.slice_,
    "Gather": convert_layout.gather,
    "Reshape": convert_layout.reshape,
    "Flatten": convert_layout.flatten,
    "Transpose": convert_layout.transpose,
    "Squeeze": convert_layout.squeeze,
    "Unsqueeze": convert_layout.unsqueeze,
    "Pad": convert_layout.pad,
    "Expand": convert_layout.expand,
    "Tile": convert_layout.tile,
    "DepthToSpace": convert_layout.depth_to_space,
    "SpaceToDepth": convert_layout.space_to_depth,
    "Cast": convert_layout.cast,
    "DynamicQuantizeLinear": convert_dynamic.dynamic_quantize_linear,
    # reached only with a run-time src zero point (else qoperator.py rewrites them)
    "MatMulInteger": convert_dynamic.integer_op,
    "ConvInteger": convert_dynamic.integer_op,
}

# (domain, op_type) -> converter; the default domain is spelled "".
CONVERTERS: dict[tuple[str, str], Converter] = {
    **{("", op): fn for op, fn in _DEFAULT.items()},
    (OPENVINO_DOMAIN, "FakeQuantize"): convert_quant.fake_quantize,
}


def import_model(
    model: onnx.ModelProto | str | os.PathLike,
    *,
    input_shapes: dict[str, tuple[int, ...]] | None = None,
) -> Graph:
    """The IR graph of an ONNX model, shapes inferred and verified."""
    proto = loading.load(model)
    opset = loading.default_opset(proto)
    onnx_graph = proto.graph
    graph = Graph(onnx_graph.name or "graph")
    ctx = Context(graph, opset, [o.name for o in onnx_graph.output])
    ctx.model = proto
    for tensor in onnx_graph.initializer:
        ctx.set_const(tensor.name, _to_array(tensor))
    for sparse in onnx_graph.sparse_initializer:
        itemsize = _itemsize(sparse.values.data_type)
        check_shape(f"sparse initializer '{sparse.values.name}' (dense)", sparse.dims, itemsize)
        try:
            ctx.set_const(sparse.values.name, folding.sparse_to_dense(sparse))
        except (ValueError, TypeError, IndexError) as exc:
            raise MalformedModelError(f"sparse initializer '{sparse.values.name}' cannot be "
                                      f"read: {exc}") from exc
    _add_inputs(ctx, onnx_graph, dict(input_shapes or {}))

    nodes = _views(onnx_graph)
    for n in nodes:
        ctx.uses.update(i for i in [*n.inputs, *islands.outer_names(n)] if i)
    nodes = patterns.fuse_gelu(_live(nodes, ctx), ctx.consts, ctx.uses)
    nodes = patterns.fuse_layer_norm(nodes, ctx.consts, ctx.uses)
    for n in nodes:
        for name in dict.fromkeys(i for i in n.inputs if i):
            ctx.readers.setdefault(name, []).append(n)
    for n in nodes:
        _convert(ctx, n)

    for out in onnx_graph.output:
        if out.name in ctx.consts:
            ctx.materialize(NodeView(out.name, "graph output", "", [], [], {}), out.name)
        elif out.name not in graph.values:
            raise MalformedModelError(f"graph output '{out.name}' is produced by no node")
        graph.outputs.append(out.name)
    islands.merge(graph)
    try:
        infer_shapes(graph)
        graph.verify()
    except GraphError as exc:
        raise MalformedModelError(str(exc)) from exc
    _check_sizes(graph)
    removed = graph.remove_unused()
    islands.choose_engines(graph)
    logger.info("imported '%s': %d nodes (%d unused removed), opset %d", graph.name,
                len(graph), removed, opset)
    return graph


def _check_sizes(graph: Graph) -> None:
    """Every value, and all of them together, within the limits (ir/limits.py), before any
    pass or the lowering allocates them."""
    total = 0
    for name, value in graph.values.items():
        if value.info is None:
            continue
        nbytes = element_count(value.info.shape) * value.info.dtype.np.itemsize
        total += nbytes
        if nbytes > limits().max_tensor_bytes:
            producer = graph.producer(name)
            what = (f"node {producer}: output '{name}'"
                    if producer is not None else f"value '{name}'")
            check_shape(what, value.info.shape, value.info.dtype.np.itemsize)
    check_total(f"the {len(graph.values)} values of graph '{graph.name}'", total)


# 8- and 16-bit types (and bool) that the spec stores in int32_data, one element per int32.
_INT32_DATA_RANGES = {TensorProto.UINT8: (0, 255), TensorProto.INT8: (-128, 127),
                      TensorProto.UINT16: (0, 65535), TensorProto.INT16: (-32768, 32767),
                      TensorProto.BOOL: (0, 1)}


def _itemsize(data_type: int) -> int:
    try:
        return int(helper.tensor_dtype_to_np_dtype(data_type).itemsize) or 1
    except (KeyError, ValueError, TypeError):
        return 1


def _to_array(tensor: onnx.TensorProto) -> np.ndarray:
    """An initializer's data, after checks numpy_helper does not make: the declared size
    against the limit (before allocating) and int32_data values within their type's range
    (numpy would wrap a UINT8 zero point of 300 to 44)."""
    check_shape(f"tensor '{tensor.name}'", tensor.dims, _itemsize(tensor.data_type))
    bounds = _INT32_DATA_RANGES.get(tensor.data_type)
    if bounds is not None and len(tensor.int32_data):
        held = np.asarray(tensor.int32_data, np.int64)
        low, high = bounds
        if int(held.min()) < low or int(held.max()) > high:
            bad = int(held.min()) if int(held.min()) < low else int(held.max())
            raise MalformedModelError(
                f"tensor '{tensor.name}' of type {onnx_type_name(tensor.data_type)} holds "
                f"{bad}, outside its range [{low}, {high}]")
    try:
        return numpy_helper.to_array(tensor)
    except (ValueError, TypeError, KeyError) as exc:
        raise MalformedModelError(f"tensor '{tensor.name}' cannot be read: {exc}") from exc


def _add_inputs(ctx: Context, onnx_graph: onnx.GraphProto,
                shapes: dict[str, tuple[int, ...]]) -> None:
    """Graph inputs that are not initializers, with static shapes."""
    names = [i.name for i in onnx_graph.input if i.name not in ctx.consts]
    unknown = sorted(set(shapes) - set(names))
    if unknown:
        raise InputError(f"input_shapes names {unknown}, which are not graph inputs "
                         f"(inputs: {names})")
    for value in onnx_graph.input:
        if value.name in ctx.consts:
            continue
        if not value.type.HasField("tensor_type"):
            raise UnsupportedModelError(f"graph input '{value.name}' is not a tensor")
        tensor_type = value.type.tensor_type
        dtype = ONNX_TO_DTYPE.get(tensor_type.elem_type)
        if dtype is None:
            raise UnsupportedModelError(f"graph input '{value.name}' has element type "
                                        f"{onnx_type_name(tensor_type.elem_type)}, which is "
                                        f"not supported")
        shape = _input_shape(value.name, tensor_type, shapes.get(value.name))
        check_shape(f"graph input '{value.name}'", shape, dtype.np.itemsize)
        ctx.graph.add_input(value.name, TensorInfo(shape, dtype))
        free = symbolic_dims(tensor_type)
        free = tuple(range(len(shape))) if free is None else free
        if free:
            ctx.graph.free_dims[value.name] = free


def _input_shape(name: str, tensor_type: onnx.TypeProto.Tensor,
                 given: tuple[int, ...] | None) -> tuple[int, ...]:
    dims = ([d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim]
            if tensor_type.HasField("shape") else None)
    if given is not None:
        given = tuple(int(d) for d in given)
        if dims is not None and (len(dims) != len(given) or any(
                d is not None and d != g for d, g in zip(dims, given, strict=True))):
            raise UnsupportedModelError(f"graph input '{name}': input_shapes gives {given} but "
                                        f"the model declares {_show_dims(tensor_type)}")
        if min(given, default=1) < 0:
            raise UnsupportedModelError(f"graph input '{name}': input_shapes gives {given}; "
                                        f"every dim must be >= 0")
        return given
    if dims is None:
        raise UnsupportedModelError(f"graph input '{name}' has an unknown rank; pass "
                                    f"input_shapes={{'{name}': (...)}}")
    if dims and dims[0] is None:
        logger.warning("graph input '%s': symbolic batch dim %s set to 1 (pass input_shapes "
                       "to choose another)", name, _show_dims(tensor_type))
        dims[0] = 1
    for i, d in enumerate(dims):
        if d is None or d < 0:
            param = tensor_type.shape.dim[i].dim_param
            what = (f"symbolic dim {i} '{param}'" if param else f"unknown dim {i}") if (
                d is None) else f"dim {i} of size {d}"
            example = "x".join(str(x) if x is not None and x >= 0 else "N" for x in dims)
            raise UnsupportedModelError(
                f"graph input '{name}' has {what} in {_show_dims(tensor_type)}; fix it with "
                f"input_shapes={{'{name}': (...)}} or --input-shape {name}={example}")
    return tuple(int(d) for d in dims)  # type: ignore[arg-type]


def _show_dims(tensor_type: onnx.TypeProto.Tensor) -> str:
    return "(" + ", ".join(d.dim_param or str(d.dim_value) if (d.dim_param or d.HasField(
        "dim_value")) else "?" for d in tensor_type.shape.dim) + ")"


def _views(onnx_graph: onnx.GraphProto) -> list[NodeView]:
    """The nodes with stable unique names (unnamed ones become ``{op_type}_{index}``)."""
    views, seen = [], set()
    for index, proto in enumerate(onnx_graph.node):
        name = proto.name or f"{proto.op_type}_{index}"
        if name in seen:
            name = f"{name}_{index}"
        seen.add(name)
        views.append(NodeView.from_proto(proto, name))
    return views


def _live(nodes: list[NodeView], ctx: Context) -> list[NodeView]:
    """Nodes some graph output depends on (dead ones are skipped, unsupported or not)."""
    producer = {out: n for n in nodes for out in n.outputs if out}
    stack = [producer[name] for name in ctx.graph_outputs if name in producer]
    live: set[int] = set()
    while stack:
        n = stack.pop()
        if id(n) not in live:
            live.add(id(n))
            stack.extend(producer[i] for i in [*n.inputs, *islands.outer_names(n)]
                         if i in producer)
    skipped = [n.name for n in nodes if id(n) not in live]
    if skipped:
        logger.debug("skipping %d nodes no output depends on: %s", len(skipped), skipped[:10])
    return [n for n in nodes if id(n) in live]


def _convert(ctx: Context, node: NodeView) -> None:
    """Fold, convert, or (what qfuse cannot express natively) make a float island."""
    domain = "" if node.domain in DEFAULT_DOMAINS else node.domain
    size = len(ctx.graph)
    try:
        if _inline_if(ctx, node):
            return
        dynamic = islands.reads_dynamic(ctx, node)
        if dynamic is not None:
            islands.add(ctx, node, f"reads '{dynamic}', whose shape is known only at run time")
            return
        if ctx.opset < loading.MIN_OPSET:
            islands.add(ctx, node, f"opset {ctx.opset} is below {loading.MIN_OPSET}, the "
                                   f"first the converters read")
            return
        if domain == "" and folding.foldable(ctx, node):
            try:
                folding.fold(ctx, node)
            except SizeLimitError:
                raise
            except UnsupportedModelError as exc:
                islands.add(ctx, node, str(exc).removeprefix(f"node {node}: "))
            return
        try:
            parts = qoperator.expand(ctx, node)  # QOperator ops → DQ → float op → Q
        except SizeLimitError:
            raise
        except UnsupportedModelError as exc:  # a QOperator form it refuses: a float island
            if len(ctx.graph) != size or node.proto is None:
                raise
            islands.add(ctx, node, str(exc).removeprefix(f"node {node}: "))
            return
        if parts is not None:
            for part in parts:
                _convert(ctx, part)
            return
        converter = CONVERTERS.get((domain, node.op_type))
        if converter is None:
            islands.add(ctx, node, _why_unsupported(ctx, node, domain))
            return
        try:
            converter(ctx, node)
        except SizeLimitError:
            raise
        except UnsupportedModelError as exc:
            if len(ctx.graph) != size or node.proto is None:
                raise
            islands.add(ctx, node, str(exc).removeprefix(f"node {node}: "))
    except (UnsupportedModelError, MalformedModelError) as exc:
        if str(exc).startswith(f"node {node}"):
            raise
        raise type(exc)(f"node {node}: {exc}") from exc
    except GraphError as exc:
        message = str(exc).split(": ", 1)[-1] if str(exc).startswith("node ") else str(exc)
        raise ctx.malformed(node, message) from exc
    except Exception as exc:  # anything else: a malformed node, named
        raise ctx.malformed(node, f"cannot convert ({type(exc).__name__}: {exc})") from exc


def _inline_if(ctx: Context, node: NodeView) -> bool:
    """An If whose condition folded to a constant (a test on a static shape: silero-vad's
    ``Equal(Gather(Shape(x), 0), ...)``, which exporters write for dynamic batches) is the
    branch it takes: that branch's nodes converted in its place (nested Ifs likewise), its
    outputs the If's (Identity). Then they fuse and quantize as any others, where an If is a
    float island run by onnxruntime (silero-vad NNCF's decoder: 72 us of a 140 us run).
    False, converting nothing, when the condition is not a constant or a name of the branch
    is already defined outside it (the island keeps it)."""
    if node.op_type != "If" or node.domain or node.proto is None or not node.inputs:
        return False
    cond = node.inputs[0]
    if not cond or not ctx.is_const(cond) or np.asarray(ctx.consts[cond]).size != 1:
        return False
    key = "then_branch" if bool(np.asarray(ctx.consts[cond]).reshape(-1)[0]) else "else_branch"
    branch = node.attrs.get(key)
    if not isinstance(branch, onnx.GraphProto) or len(branch.output) != len(node.outputs):
        return False
    inner = [t.name for t in branch.initializer] + [o for p in branch.node for o in p.output if o]
    outer = {o for p in ctx.model.graph.node for o in p.output}
    if any(name in ctx.consts or name in ctx.graph.values or name in outer for name in inner):
        return False
    for tensor in branch.initializer:
        ctx.set_const(tensor.name, _to_array(tensor))
    views = [NodeView.from_proto(proto, f"{node.name}/{proto.name or f'{proto.op_type}_{i}'}")
             for i, proto in enumerate(branch.node)]
    for view in views:
        ctx.uses.update(i for i in [*view.inputs, *islands.outer_names(view)] if i)
        for name in dict.fromkeys(i for i in view.inputs if i):
            ctx.readers.setdefault(name, []).append(view)
    for view in views:
        _convert(ctx, view)
    for value, out in zip(branch.output, node.outputs, strict=True):
        if not out:
            continue
        if value.name in ctx.consts:
            ctx.set_const(out, ctx.consts[value.name])
        else:
            ctx.uses[value.name] += 1
            _convert(ctx, NodeView.from_proto(helper.make_node("Identity", [value.name], [out]),
                                              f"{node.name}/{out}"))
    logger.debug("If %s: its %s inlined (%d nodes)", node, key, len(views))
    return True


def _why_unsupported(ctx: Context, node: NodeView, domain: str) -> str:
    if domain:
        return f"op {node.op_type} of domain '{domain}' has no native lowering"
    if node.op_type in ("LSTM", "GRU", "RNN"):
        return (f"the IR has no {node.op_type} op: oneDNN's RNN primitive runs it where it can "
                "(compiler/lower/lower_rnn.py), else onnxruntime")
    return f"op {node.op_type} has no native lowering"


__all__ = ["CONVERTERS", "MalformedModelError", "UnsupportedModelError", "import_model"]
