"""Op by op agreement (``qfuse check``): every kernel of a compiled plan fed the reference's
inputs, its integer output compared with the reference's.

The reference is exact QDQ: every tensor of the ONNX model computed by onnxruntime with graph
optimizations off (ORT_DISABLE_ALL; every node output added as a graph output, which changes
nothing it computes), or by qfuse's reference interpreter on the imported graph. For a
QOperator or quantize_dynamic model onnxruntime's QLinearConv / QLinearMatMul / QGemm /
MatMulInteger / ConvInteger are not exact on CPUs without VNNI (int16 saturation,
examples/realzoo/exact.py): ``qfuse check`` then takes the model's exact form as
``reference_model`` by itself (its tensors keep the model's names; ``--reference-model``
overrides it).

Teacher forcing (``Executor.run_forced``): right after the kernel that writes a value the
reference also has (same name, shape and dtype), the plan's own value is kept and the
reference's is written over it, so every later kernel reads the reference's inputs. A kernel's
difference is then its own: one rounding step of one kernel does not cascade into the next
layers. Float values are forced too (a float island's output before the kernel quantizing it);
their error is reported as a share of the largest reference magnitude.

Per compared integer value: elements, how many differ, the largest difference in quantization
steps (LSB), and, where the value is a QuantizeLinear output of the ONNX model whose input the
reference has, how far from a rounding tie the reference's ``x/s`` was at the differing
elements (``tie``: the largest ``|x/s - floor(x/s) - 1/2|``, 0 at an exact tie; a one-step
difference at a tie distance of 1e-5 is a float32 near-tie, not a wrong formula). The row names the compiled
node that produces the value, its oneDNN kernels and the rounding form ``inspect`` prints.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import onnx

from qfuse.compiler.api import CompiledModel, ModelLike, compile_model
from qfuse.compiler.errors import InputError
from qfuse.compiler.lower.layouts import RESHAPES
from qfuse.ir.graph import in_graph_order, in_model_order, shifted_levels
from qfuse.ir import DType, Graph, Node, TensorInfo

log = logging.getLogger(__name__)

__all__ = ["FloatRow", "IntRow", "OpCheck", "check_op_by_op", "format_text",
           "reference_values"]

ENGINES = ("onnxruntime", "interpreter")


@dataclass(frozen=True)
class IntRow:
    """One integer value of the plan against the reference (fed the reference's inputs)."""

    tensor: str
    node: str  # the compiled-graph node producing it ('' for a graph input)
    op: str
    kernels: list[str]
    rounding: str
    elements: int
    differing: int
    max_lsb: int
    tie: float | None = None  # the largest distance from a tie of x/s at differing elements
    against: str = "reference"  # or "graph": a value only the compiled graph has (_Meaning)

    @property
    def share(self) -> float:
        return self.differing / self.elements if self.elements else 0.0


@dataclass(frozen=True)
class FloatRow:
    tensor: str
    node: str
    op: str
    rel_error: float  # max |plan - reference| / max |reference| (1 if the reference is 0)
    against: str = "reference"


@dataclass
class OpCheck:
    model: str
    mode: str
    engine: str
    ints: list[IntRow] = field(default_factory=list)
    floats: list[FloatRow] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # plan value -> why not compared

    @property
    def max_lsb(self) -> int:
        return max((r.max_lsb for r in self.ints), default=0)

    def above(self, lsb: int = 1) -> list[IntRow]:
        return [r for r in self.ints if r.max_lsb > lsb]

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "mode": self.mode, "engine": self.engine,
                "max_lsb": self.max_lsb,
                "ints": [{**asdict(r), "share": r.share} for r in self.ints],
                "floats": [asdict(r) for r in self.floats], "skipped": self.skipped}


def _ort_values(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]
                ) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    known = {o.name for o in graph.output}
    produced = [o for n in graph.node if n.op_type != "Constant" for o in n.output if o]
    graph.output.extend(onnx.ValueInfoProto(name=n) for n in dict.fromkeys(produced)
                        if n not in known)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(model.SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001  onnxruntime raises its own exception types
        raise InputError(f"onnxruntime cannot load the reference model: "
                         f"{str(exc).splitlines()[0]}") from exc
    names = [o.name for o in session.get_outputs()]
    inputs = {i.name for i in session.get_inputs()}
    values = session.run(None, {k: v for k, v in feeds.items() if k in inputs})
    found = {n: v for n, v in zip(names, values, strict=True) if isinstance(v, np.ndarray)}
    return {**feeds, **found}


def reference_values(model: ModelLike, feeds: Mapping[str, np.ndarray], engine: str = "onnxruntime"
                     ) -> dict[str, np.ndarray]:
    """Every tensor of ``model`` on ``feeds``, by name, computed by ``engine``."""
    if engine not in ENGINES:
        raise InputError(f"unknown reference engine {engine!r}; choose one of {ENGINES}")
    if engine == "onnxruntime":
        proto = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model))
        return _ort_values(proto, feeds)
    from qfuse.compiler.api import import_graph
    from qfuse.runtime.reference import evaluate

    return dict(evaluate(import_graph(model), dict(feeds), keep=True))


def _quantizers(compiled: CompiledModel) -> dict[str, tuple[str, np.ndarray]]:
    """{QuantizeLinear output: (its input, its scale)} of the imported (ONNX) graph."""
    from qfuse.ir import Op

    found = {}
    for node in compiled.graph:
        if node.op is Op.QUANTIZE_LINEAR:
            scale = compiled.graph.constant(node.inputs[1])
            if scale is not None:
                found[node.outputs[0]] = (node.inputs[0], np.asarray(scale, np.float32))
    return found


def _tie_distance(x: np.ndarray, scale: np.ndarray, where: np.ndarray, axis: int) -> float:
    """The largest |x/s - floor(x/s) - 1/2| over ``where`` (0: an exact tie; x/s as
    onnxruntime's MLAS computes it, a float32 division)."""
    if scale.size > 1:
        shape = [1] * x.ndim
        shape[axis] = scale.size
        scale = scale.reshape(shape)
    t = (x.astype(np.float32) / scale).astype(np.float64)
    t = np.broadcast_to(t, where.shape)[where]
    return float(np.max(np.abs(t - np.floor(t) - 0.5), initial=0.0))


def check_op_by_op(model: ModelLike, feeds: Mapping[str, np.ndarray], *,
                   compiled: CompiledModel | None = None, mode: str = "fused",
                   engine: str = "onnxruntime", reference_model: ModelLike | None = None,
                   reference: Mapping[str, np.ndarray] | None = None) -> OpCheck:
    """Every value of ``model``'s compiled plan computed from the reference's inputs, against
    the reference (module docstring). ``reference``: precomputed reference values (else
    computed by ``engine`` on ``reference_model`` or ``model``)."""
    if compiled is None:
        compiled = compile_model(model, mode=mode)
    if compiled.executor is None or compiled.compiled_graph is None:
        raise InputError(f"mode {compiled.mode!r} has no plan to check kernel by kernel")
    if reference is None:
        reference = reference_values(reference_model if reference_model is not None
                                     else model, feeds, engine)
    graph, plan = compiled.compiled_graph, compiled.plan
    check = OpCheck(str(model) if not isinstance(model, onnx.ModelProto) else model.graph.name,
                    str(compiled.mode), engine)
    forced: dict[str, np.ndarray] = {}
    derived: set[str] = set()
    meaning = _Meaning(graph, feeds, reference)
    for value in plan.homes:
        if value in plan.inputs:
            continue
        info = graph.info(value) if value in graph.values else None
        if info is None:
            check.skipped[value] = "not a value of the compiled graph"
            continue
        if value not in reference:
            try:
                forced[value] = np.ascontiguousarray(meaning.value(value))
                derived.add(value)
            except Exception as exc:  # noqa: BLE001  reported, not fatal: one value unchecked
                check.skipped[value] = f"its meaning cannot be computed: {exc}"
            continue
        ref = in_plan_type(np.asarray(reference[value]), info, graph.channel_orders.get(value),
                           level_offset(graph, value))
        if info.shape != ref.shape or info.dtype.np != ref.dtype:
            check.skipped[value] = (f"{info.dtype.np}{list(info.shape)} in the plan, "
                                    f"{ref.dtype}{list(ref.shape)} in the reference")
        else:
            forced[value] = np.ascontiguousarray(ref)
    got = compiled.executor.run_forced(dict(feeds), forced)
    kernels: dict[str, list[dict[str, Any]]] = {}
    for k in compiled.inspect()["kernels"]:
        if k.get("node"):
            kernels.setdefault(k["node"], []).append(k)
    quantizers = _quantizers(compiled)
    for value, ref in forced.items():
        if value not in got:
            check.skipped[value] = "not materialized by the plan (absorbed or zero-copy)"
            continue
        mine = got[value]
        producer = _computing_producer(graph, value)
        node = producer.name if producer is not None else ""
        op = producer.op.value if producer is not None else ""
        if ref.dtype.kind in "iu":
            diff = np.abs(mine.astype(np.int64) - ref.astype(np.int64))
            differing = diff != 0
            tie = None
            q = quantizers.get(value)
            if q is not None and differing.any() and q[0] in reference:
                axis = _axis(compiled, value)
                tie = _tie_distance(np.asarray(reference[q[0]]), q[1], in_reference_type(
                    differing, differing.dtype, graph.channel_orders.get(value)), axis)
            ks = kernels.get(node, [])
            check.ints.append(IntRow(
                value, node, op, [k["name"] for k in ks],
                next((k["rounding"] for k in ks if k.get("rounding")), ""),
                int(diff.size), int(np.count_nonzero(differing)),
                int(diff.max(initial=0)), tie, "graph" if value in derived else "reference"))
        else:
            top, err = _float_error(mine, ref)
            check.floats.append(FloatRow(value, node, op, err / top if top else float(err > 0),
                                         "graph" if value in derived else "reference"))
    return check


def _float_error(mine: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """(largest finite |reference|, largest |difference|): equal values, the same infinity and
    NaN against NaN count as no difference, NaN against a number as an infinite one."""
    a, b = np.asarray(mine, np.float64), np.asarray(ref, np.float64)
    with np.errstate(invalid="ignore"):
        diff = np.abs(a - b)
    diff[(a == b) | (np.isnan(a) & np.isnan(b))] = 0.0
    diff[np.isnan(diff)] = np.inf
    finite = np.abs(b[np.isfinite(b)])
    return float(finite.max(initial=0.0)), float(diff.max(initial=0.0))


def level_offset(graph: Graph, value: str) -> int | None:
    """What the compiled graph adds to the model's integers of ``value`` (``level_offsets``)."""
    found = graph.level_offsets.get(value)
    return None if found is None else found[0]


def in_plan_type(ref: np.ndarray, info: TensorInfo, order: np.ndarray | None = None,
                 offset: int | None = None) -> np.ndarray:
    """The reference's tensor as the plan holds it: an activation the plan re-encoded
    (passes/decompose_fake_quantize.py: the zero level, unsigned activations) as ``q +
    offset`` in the plan's type (``Graph.level_offsets``; without one, an s8 tensor the plan
    holds as u8 is ``q + 128``), the same dequantized values; channels in the plan's
    ``order`` (``Graph.channel_orders``, passes/pair_channels.py); anything else unchanged."""
    ref = in_graph_order(ref, order)
    if offset is None and ref.dtype == np.int8 and info.dtype is DType.U8:
        offset = 128
    if offset is not None and ref.dtype.kind in "iu" and ref.shape == info.shape:
        return shifted_levels(ref, offset, info.dtype.np)
    return ref


def in_reference_type(mine: np.ndarray, ref_dtype: np.dtype,
                      order: np.ndarray | None = None, offset: int | None = None
                      ) -> np.ndarray:
    """The inverse of ``in_plan_type``: the plan's re-encoded tensor as the reference's
    integers, its channels in the model's order."""
    mine = in_model_order(mine, order)
    if offset is None and mine.dtype == np.uint8 and np.dtype(ref_dtype) == np.int8:
        offset = 128
    if offset is not None and mine.dtype.kind in "iu":
        return shifted_levels(mine, -offset, np.dtype(ref_dtype))
    return mine


class _Meaning:
    """A value only the compiled graph has (a requantize into a Concat's scale, the integer
    form of a Reshape, a sign shift): its node's reference semantics (the interpreter's op
    table, a fused node's chain) on the reference's values, computed on demand."""

    def __init__(self, graph: Graph, feeds: Mapping[str, np.ndarray],
                 reference: Mapping[str, np.ndarray]) -> None:
        self.graph, self.feeds, self.reference = graph, feeds, reference
        self.memo: dict[str, np.ndarray] = {}

    def value(self, name: str) -> np.ndarray:
        from qfuse.runtime.reference.interpreter import conform, run_node

        graph = self.graph
        data = graph.constant(name)
        if data is not None:
            return data
        if name in self.feeds:
            return np.asarray(self.feeds[name])
        info = graph.info(name)
        ref = self.reference.get(name)
        if ref is not None:
            ref = in_plan_type(np.asarray(ref), info, graph.channel_orders.get(name),
                               level_offset(graph, name))
        if ref is not None and ref.shape == info.shape and ref.dtype == info.dtype.np:
            return ref
        if name not in self.memo:
            node = graph.producer(name)
            if node is None:
                raise ValueError(f"'{name}' has no producer")
            args = [self.value(v) if v else None for v in node.inputs]
            for out, array in zip(node.outputs, run_node(node, args, graph), strict=True):
                self.memo[out] = conform(graph, out, np.asarray(array))
        return self.memo[name]


def _axis(compiled: CompiledModel, value: str) -> int:
    from qfuse.ir import Op

    producer = compiled.graph.producer(value)
    if producer is not None and producer.op is Op.QUANTIZE_LINEAR:
        axis = int(getattr(producer.attrs, "axis", 1))
        return axis % max(len(compiled.graph.info(value).shape), 1)
    return 1


def format_text(check: OpCheck, *, all_rows: bool = False) -> str:
    """The rows with a difference (every row with ``all_rows``), worst first, and a summary."""
    rows = sorted(check.ints, key=lambda r: (-r.max_lsb, -r.share))
    graph_rows = sum(r.against == "graph" for r in check.ints)
    if not all_rows:
        rows = [r for r in rows if r.differing]
    width = max([len("tensor")] + [len(r.tensor) for r in rows])
    lines = [f"op by op: {check.model} ({check.mode}) against {check.engine} "
             f"(each kernel fed the reference's inputs)",
             f"{'tensor':<{width}}  {'max LSB':>7}  {'differ':>9}  {'tie':>8}  node (op): rounding"
             ]
    for r in rows:
        tie = "" if r.tie is None else f"{r.tie:.1e}"
        mark = "*" if r.against == "graph" else " "
        lines.append(f"{r.tensor:<{width}}{mark} {r.max_lsb:>7}  {100 * r.share:>8.4f}%  "
                     f"{tie:>8}  {r.node} ({r.op}): {r.rounding or '-'}")
    n = len(check.ints)
    exact = sum(not r.differing for r in check.ints)
    worst_float = max((r.rel_error for r in check.floats), default=0.0)
    lines.append(f"{n} integer tensors compared: {exact} identical, {n - exact} differ, "
                 f"max {check.max_lsb} LSB; above 1 LSB: {len(check.above(1))}; "
                 f"{len(check.floats)} float tensors, max relative error {worst_float:.2e}; "
                 f"{len(check.skipped)} not compared")
    if graph_rows:
        lines.append(f"*: {graph_rows} values only the compiled graph has (requantizes, integer "
                     "reshapes), against its own op semantics on the reference's values")
    return "\n".join(lines)


def main_check(args: Any) -> int:
    from qfuse.compiler.cli_output import emit
    from qfuse.compiler.api import random_inputs
    from qfuse.compiler.input_files import read_inputs

    compiled = compile_model(args.model, mode=args.mode)
    feeds = (read_inputs(args.inputs, compiled.inputs) if args.inputs
             else random_inputs(compiled, seed=0))
    if args.reference_model is None and args.engine == "onnxruntime":
        args.reference_model = _exact_form(args.model)
    result = check_op_by_op(args.model, feeds, compiled=compiled, engine=args.engine,
                            reference_model=args.reference_model)
    if isinstance(args.reference_model, onnx.ModelProto):
        result.engine = f"{result.engine} on the model's exact form ({EXACT_FORM})"
    if not getattr(args, "blame", False):
        emit(args.json, result.to_json(), lambda: format_text(result, all_rows=args.all))
        return 0
    from qfuse.compiler.op_blame import blame, format_blame

    if args.engine != "onnxruntime":
        raise InputError("--blame runs the reference in onnxruntime; use --engine onnxruntime")
    found = blame(args.model, feeds, compiled=compiled, reference_model=args.reference_model,
                  draws=args.blame_draws)
    emit(args.json, {**result.to_json(), "blame": found.to_json()},
         lambda: format_text(result, all_rows=args.all) + "\n\n" + format_blame(found))
    return 0


EXACT_FORM = "integer-product ops as float ops: onnxruntime's int8 kernels saturate without VNNI"


def _exact_form(model: Any) -> onnx.ModelProto | None:
    """The model's exact form (examples/realzoo/exact.py) when it has integer-product ops
    onnxruntime would run on its int8 kernels; None otherwise (the model is its own
    reference)."""
    from qfuse.compiler.onnx_import.loading import load
    from qfuse.examples.realzoo.exact import exact_qdq, has_integer_products

    proto = load(model)
    if not has_integer_products(proto):
        return None
    try:
        return exact_qdq(proto)
    except ValueError as exc:  # a per-axis operand computed at run time: keep the model
        log.info("no exact form of the model (%s): onnxruntime runs its int8 kernels", exc)
        return None


def _computing_producer(graph: Graph, value: str) -> Node | None:
    """The node that computes ``value``: its producer, or through reshapes (views that move
    no value: flatten_matmul_rows' ``/unflatten``) the node before them."""
    producer = graph.producer(value)
    while (producer is not None and producer.op in RESHAPES and producer.fused is None
           and graph.producer(producer.inputs[0]) is not None):
        producer = graph.producer(producer.inputs[0])
    return producer
