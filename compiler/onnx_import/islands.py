"""Float islands: ONNX nodes the IR has no op for, kept as ONNX and run by an ONNX engine.

A node becomes an island when qfuse cannot express it natively: its op (or domain) has no
converter, its converter declines it (UnsupportedModelError: a parameter such as a weight,
scale, shape, start or size arrives at run time instead of as a constant, an unsupported
mode, ...), it reads a value whose shape is only known at run time, or the model's opset is
below the range the converters are written for. ``add`` turns one ONNX node into an IR node
``Op.ISLAND`` holding a one-node ONNX model (the constants it reads become the model's
initializers; the values a control-flow body reads from the outer scope become inputs).
Its output infos come from ONNX shape inference (``onnx.shape_inference.infer_shapes`` with
data propagation) over the static input shapes; an output whose shape inference leaves open
is *dynamic*, and every node reading it joins an island too, so dynamic shapes only ever
reach graph outputs.

``merge`` then joins islands connected by a value into maximal islands, as long as no path
through a non-island node leads from one to the other (that would make a cycle), and
``choose_engines`` picks each island's engine for the compiled modes: onnxruntime when it can
create a session over the island, else onnx.reference (ir.ops.IslandEngine). Quantized values
reach an island through the DequantizeLinear nodes before it and leave through the
QuantizeLinear nodes after it, as in the model: passes treat an island as opaque float compute.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qfuse.compiler.errors import MalformedModelError, UnsupportedModelError
from qfuse.compiler.onnx_import.context import ONNX_TO_DTYPE, Context, NodeView, onnx_type_name
from qfuse.ir.graph import Graph, Node
from qfuse.ir.limits import limits
from qfuse.ir.ops import IslandAttrs, IslandEngine, Op
from qfuse.ir.types import DType, TensorInfo

logger = logging.getLogger(__name__)

DTYPE_TO_ONNX = {dtype: elem for elem, dtype in ONNX_TO_DTYPE.items()}
_PENDING = IslandEngine.ONNX_REFERENCE  # until choose_engines has tried onnxruntime


def add(ctx: Context, node: NodeView, reason: str) -> None:
    """Emit ``node`` as a one-node island (module docstring); when it cannot be one either,
    UnsupportedModelError gives both reasons."""
    if node.proto is None:
        raise ctx.unsupported(node, reason)
    try:
        _add(ctx, node, reason)
    except (UnsupportedModelError, MalformedModelError) as exc:
        why = str(exc).removeprefix(f"node {node}: ")
        error = ctx.unsupported if isinstance(exc, UnsupportedModelError) else ctx.malformed
        raise error(node, f"{reason}; as a float island: {why}") from exc


def _add(ctx: Context, node: NodeView, reason: str) -> None:
    names = list(dict.fromkeys([i for i in node.inputs if i] + sorted(_outer_names(node.proto))))
    inputs, initializers = [], []
    for name in names:
        if ctx.is_const(name):
            initializers.append(numpy_helper.from_array(np.asarray(ctx.consts[name]), name))
        elif name in ctx.graph.values:
            inputs.append(name)
        else:
            raise ctx.malformed(node, f"reads '{name}', which no earlier node produces")
    infos = [_unshaped(ctx.graph.info(n)) if n in ctx.dynamic else ctx.graph.info(n)
             for n in inputs]
    outputs = [o for o in node.outputs if o]
    model = _model(ctx.model, [node.proto], initializers, list(zip(inputs, infos, strict=True)),
                   [(o, None) for o in outputs])
    out_infos, dynamic = _infer(ctx, node, model, outputs)
    model = _model(ctx.model, [node.proto], initializers, list(zip(inputs, infos, strict=True)),
                   list(zip(outputs, [None if d else i for i, d in zip(out_infos, dynamic,
                                                                       strict=True)],
                             strict=True)))
    for name in outputs:
        if name in ctx.graph.values or name in ctx.consts:
            raise ctx.malformed(node, f"output '{name}' is already defined")
    if (not inputs and node.op_type not in NONDETERMINISTIC and not any(dynamic)
            and all(i.size * i.dtype.np.itemsize <= limits().max_tensor_bytes
                    for i in out_infos)):
        values = _evaluate_once(model, outputs)
        if values is not None:  # every input a constant: the outputs are constants too
            for name, value in zip(outputs, values, strict=True):
                ctx.set_const(name, value)
            logger.info("node %s (%s) reads only constants: folded by onnxruntime",
                        node, reason)
            return
    attrs = IslandAttrs(model.SerializeToString(), (node.op_type,), tuple(node.origin),
                        _PENDING, reason, tuple(out_infos), tuple(dynamic))
    ir_node = ctx.graph.add_node(Op.ISLAND, inputs, outputs, attrs, name=node.name,
                                 infos=out_infos, origin=node.origin)
    ctx.dynamic.update(o for o, d in zip(ir_node.outputs, dynamic, strict=True) if d)
    logger.info("node %s runs in a float island: %s", node, reason)


# ops whose outputs differ from run to run (unseeded): never folded into constants
NONDETERMINISTIC = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike",
                              "RandomUniformLike", "Multinomial", "Bernoulli"})


def _evaluate_once(model: onnx.ModelProto, outputs: list[str]) -> list[np.ndarray] | None:
    """The outputs of a one-node island that reads only constants, computed once by
    onnxruntime (as the island would compute them on every run; the reference interpreter
    runs islands there too): a DequantizeLinear of a constant whose +inf scale qfuse's
    kernels cannot take (quantize_static's causal attention mask). None if onnxruntime
    cannot run it (the island stays, its engine chosen later). The caller checks the
    outputs' declared sizes against the tensor limit first."""
    from qfuse.runtime.reference.ops_island import new_ort_session

    try:
        values = new_ort_session(model.SerializeToString()).run(outputs, {})
    except Exception as exc:  # noqa: BLE001 (onnxruntime refuses: the island decides later)
        logger.debug("constant island not folded: %s", _first_line(exc))
        return None
    return [np.asarray(v) for v in values]


def _outer_names(proto: onnx.NodeProto) -> set[str]:
    """Names a node's subgraphs read from the enclosing scope."""
    found: set[str] = set()
    for attr in proto.attribute:
        for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
            defined = {i.name for i in sub.input} | {t.name for t in sub.initializer}
            defined |= {t.values.name for t in sub.sparse_initializer}
            for n in sub.node:
                for name in [*n.input, *_outer_names(n)]:
                    if name and name not in defined:
                        found.add(name)
                defined.update(n.output)
    return found


def _unshaped(info: TensorInfo) -> DType:
    return info.dtype


def outer_names(node: NodeView) -> list[str]:
    """The values ``node``'s subgraphs (If / Loop / Scan bodies) read from the outer scope."""
    return sorted(_outer_names(node.proto)) if node.proto is not None else []


def _value_info(name: str, info: TensorInfo | DType | None) -> onnx.ValueInfoProto:
    """A tensor's type: None unknown, a DType alone when its shape is only known at run time."""
    if info is None:
        return helper.make_empty_tensor_value_info(name)
    if isinstance(info, DType):
        return helper.make_tensor_value_info(name, DTYPE_TO_ONNX[info], None)
    return helper.make_tensor_value_info(name, DTYPE_TO_ONNX[info.dtype], list(info.shape))


def _model(template: onnx.ModelProto, nodes: list[onnx.NodeProto],
           initializers: list[onnx.TensorProto],
           inputs: list[tuple[str, TensorInfo | DType]],
           outputs: list[tuple[str, TensorInfo | None]]) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "island", [_value_info(n, i) for n, i in inputs],
                              [_value_info(n, i) for n, i in outputs], initializers)
    model = helper.make_model(graph, opset_imports=list(template.opset_import))
    model.ir_version = template.ir_version
    model.functions.extend(template.functions)
    return model


def _infer(ctx: Context, node: NodeView, model: onnx.ModelProto,
           outputs: list[str]) -> tuple[list[TensorInfo], list[bool]]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception as exc:  # noqa: BLE001 (inference failing on a valid node: no shapes)
        logger.debug("shape inference failed on %s: %s", node, exc)
        inferred = model
    types = {v.name: v.type for v in [*inferred.graph.value_info, *inferred.graph.output]}
    if any(_untyped(types.get(name)) for name in outputs):
        types.update(_ort_types(model))
    infos, dynamic = [], []
    for name in outputs:
        kind = types.get(name)
        if _untyped(kind):
            raise ctx.unsupported(node, f"output '{name}' has a type ONNX shape inference "
                                        f"cannot tell (not a tensor, or unknown)")
        tensor = kind.tensor_type
        dtype = ONNX_TO_DTYPE.get(tensor.elem_type)
        if dtype is None:
            raise ctx.unsupported(node, f"output '{name}' has element type "
                                        f"{onnx_type_name(tensor.elem_type)}, which the IR "
                                        f"cannot hold")
        dims = ([d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
                if tensor.HasField("shape") else None)
        known = dims is not None and all(d is not None and d >= 0 for d in dims)
        infos.append(TensorInfo(tuple(dims) if known else (), dtype))  # type: ignore[arg-type]
        dynamic.append(not known)
    return infos, dynamic


def _untyped(kind: onnx.TypeProto | None) -> bool:
    return kind is None or not kind.HasField("tensor_type") or not kind.tensor_type.elem_type


def _ort_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Output types as onnxruntime's session reports them (it types contrib and custom-domain
    ops ONNX shape inference does not know); {} when it cannot open the island."""
    from qfuse.runtime.reference.ops_island import ort_session

    try:
        session = ort_session(model.SerializeToString())
    except Exception:  # noqa: BLE001 (no session: the caller reports the untyped output)
        return {}
    elem = {f"tensor({helper.tensor_dtype_to_np_dtype(e).name})": e for e in DTYPE_TO_ONNX.values()
            if e != onnx.TensorProto.BOOL}
    elem.update({"tensor(float)": onnx.TensorProto.FLOAT, "tensor(double)":
                 onnx.TensorProto.DOUBLE, "tensor(bool)": onnx.TensorProto.BOOL,
                 "tensor(float16)": onnx.TensorProto.FLOAT16})
    found = {}
    for out in session.get_outputs():
        if out.type in elem:
            dims = [d if isinstance(d, int) else None for d in out.shape] if out.shape is not None \
                else None
            found[out.name] = helper.make_tensor_type_proto(elem[out.type], dims)
    return found


def reads_dynamic(ctx: Context, node: NodeView) -> str | None:
    """The first input of ``node`` whose shape is only known at run time, if any."""
    for name in node.inputs:
        if name in ctx.dynamic:
            return name
    if node.proto is not None:
        for name in sorted(_outer_names(node.proto)):
            if name in ctx.dynamic:
                return name
    return None


# ------------------------------------------------------------------------------ merging
def merge(graph: Graph) -> int:
    """Join connected islands into maximal ones (module docstring); returns the merges.

    Each pass visits the islands in topological order and joins each with its mergeable
    island readers until it has none (the joined island keeps its name); passes repeat until
    one joins nothing. One topological sort per pass, not per join: torchvision's SSDlite
    post-processing (1556 nodes in one island) took 41 s to import with a sort per join."""
    merged = 0
    changed = True
    while changed:
        changed = False
        for name in [n.name for n in graph.topo_order() if n.op is Op.ISLAND]:
            while graph.has_node(name):
                node = graph.node(name)
                target = next((r for out in node.outputs for r, _ in graph.consumers(out)
                               if r.op is Op.ISLAND and _mergeable(graph, node, r)), None)
                if target is None:
                    break
                _join(graph, node, target)
                merged += 1
                changed = True
    return merged


def _mergeable(graph: Graph, first: Node, second: Node) -> bool:
    """No path first → (non-island or other node) → second besides the direct edges."""
    for out in first.outputs:
        for reader, _ in graph.consumers(out):
            if reader is not second and graph.reaches(reader, second):
                return False
    return True


def _input_type(graph: Graph, value: str) -> TensorInfo | DType:
    producer = graph.producer(value)
    if producer is not None and producer.op is Op.ISLAND and producer.attrs.dynamic[
            producer.outputs.index(value)]:
        return _unshaped(graph.info(value))
    return graph.info(value)


def _join(graph: Graph, first: Node, second: Node) -> None:
    a: IslandAttrs = first.attrs
    b: IslandAttrs = second.attrs
    ma, mb = onnx.load_from_string(a.model), onnx.load_from_string(b.model)
    inits = {t.name: t for t in [*ma.graph.initializer, *mb.graph.initializer]}
    inputs = list(dict.fromkeys([*first.inputs, *(v for v in second.inputs
                                                  if v not in first.outputs)]))
    kept = [(o, info, dyn) for o, info, dyn in zip(first.outputs, a.infos, a.dynamic,
                                                   strict=True)
            if o in graph.outputs or any(r is not second for r, _ in graph.consumers(o))]
    kept += list(zip(second.outputs, b.infos, b.dynamic, strict=True))
    model = _model(ma, [*ma.graph.node, *mb.graph.node], list(inits.values()),
                   [(v, _input_type(graph, v)) for v in inputs],
                   [(o, None if dyn else info) for o, info, dyn in kept])
    reasons = list(dict.fromkeys([*a.reason.split("; "), *b.reason.split("; ")]))
    attrs = IslandAttrs(model.SerializeToString(), a.ops + b.ops, a.nodes + b.nodes, _PENDING,
                        "; ".join(reasons), tuple(k[1] for k in kept), tuple(k[2] for k in kept))
    origin = [*first.origin, *second.origin]
    name = first.name
    # Swap in the merged node: outputs under temporary names, old nodes removed, renamed back.
    temp = graph.add_node(Op.ISLAND, inputs, len(kept), attrs, name=f"{name}#merge",
                          infos=[k[1] for k in kept], origin=origin)
    for (old, _, _), new in zip(kept, temp.outputs, strict=True):
        graph.replace_all_uses(old, new)
    for out in first.outputs:
        if out not in dict.fromkeys(k[0] for k in kept):
            for reader, port in graph.consumers(out):
                if reader is second:
                    graph.set_input(reader, port, "")
    graph.remove_node(second)
    graph.remove_node(first)
    final = graph.add_node(Op.ISLAND, inputs, [k[0] for k in kept], attrs, name=name,
                           infos=[k[1] for k in kept], origin=origin)
    for new, old in zip(temp.outputs, final.outputs, strict=True):
        graph.replace_all_uses(new, old)
    graph.remove_node(temp)


# ------------------------------------------------------------------------------- engines
def choose_engines(graph: Graph) -> None:
    """onnxruntime for every island it can create a session for, else onnx.reference."""
    from qfuse.runtime.reference.ops_island import ort_session, reference_evaluator

    for node in list(graph.topo_order()):
        if node.op is not Op.ISLAND:
            continue
        attrs: IslandAttrs = node.attrs
        try:
            ort_session(attrs.model)
            engine = IslandEngine.ONNXRUNTIME
        except Exception as ort_error:  # noqa: BLE001 (ORT refuses: try the ONNX reference)
            try:
                reference_evaluator(attrs.model)
            except Exception as ref_error:
                raise UnsupportedModelError(
                    f"island '{node.name}' (ops {', '.join(sorted(set(attrs.ops)))}; "
                    f"{attrs.reason}): neither onnxruntime ({_first_line(ort_error)}) nor "
                    f"onnx.reference ({_first_line(ref_error)}) can run it") from ref_error
            engine = IslandEngine.ONNX_REFERENCE
        node.attrs = IslandAttrs(attrs.model, attrs.ops, attrs.nodes, engine, attrs.reason,
                                 attrs.infos, attrs.dynamic)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200] if text else ''}"


def describe(graph: Graph) -> list[dict[str, object]]:
    """The islands for `inspect`: name, nodes, ops, engine, reason."""
    found = []
    for node in graph.topo_order():
        if node.op is Op.ISLAND:
            attrs: IslandAttrs = node.attrs
            found.append({"name": node.name, "nodes": list(attrs.nodes), "ops": list(attrs.ops),
                          "engine": attrs.engine.value, "reason": attrs.reason,
                          "dynamic_outputs": [o for o, d in zip(node.outputs, attrs.dynamic,
                                                                strict=True) if d]})
    return found


__all__ = ["DType", "add", "choose_engines", "describe", "merge", "reads_dynamic"]
