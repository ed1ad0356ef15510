"""Run one fuzz model three ways and classify the outcome (tests/fuzz/README.md).

The model runs as qfuse's fused oneDNN plan (twice: the first run after compile and a second
one must be identical), as qfuse's reference interpreter (exact ONNX semantics) and as
onnxruntime with graph optimizations off (``ORT_DISABLE_ALL``: DequantizeLinear → float op →
QuantizeLinear node by node, the model's ONNX meaning; tests/ort_int8.py explains why ORT's
optimized int8 kernels are not a reference on CPUs without VNNI).

Differences are measured on each graph output in steps of its quantizer (the scale of the
DequantizeLinear that produces it; an output without one is measured in steps of
``max|ref| / 127``) and the worst output decides the class:

    crash · hang (only the campaign sees these: the process dies or stops)
    compile    compile_model(mode="fused") raised: a valid model must never be rejected
    run        the fused model raised at run time
    nondeterministic  the second fused run differs from the first
    reference  the reference interpreter raised (a bug in it, or an invalid model)
    exact · le1 · le3 · worse   max |fused − reference| in LSB: 0, ≤ 1, ≤ 3, more

A difference is a *tie* when, at the first quantized tensor (in topological order) that
differs, every differing element either differs by one step where the reference's ``x / s``
lies within ``TIE_EPS`` of a half-integer, or lies (at the same position, or on a line along
one axis: Softmax mixes one) on such a near tie of a quantizer upstream that the fused plan
absorbed into a kernel and does not materialize (its step then grows by the scales between).
There the two roundings of the same real value may part (oneDNN computes ``x·f32(1/s) + zp``
in float from sums taken in another order; docs/numerics.md), and everything downstream
inherits it.
"""

from __future__ import annotations

import math
import traceback
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from tests.fuzz.generator import Spec, quantized_model, fuzz_inputs

#: |frac(x / s) − 0.5| below this (in steps) counts as a rounding tie
TIE_EPS = 1e-4
CLASSES = ("crash", "hang", "compile", "run", "nondeterministic", "reference",
           "exact", "le1", "le3", "worse")
FAILURES = ("crash", "hang", "compile", "run", "nondeterministic", "reference", "le3", "worse")


@dataclass
class Result:
    seed: int
    summary: str
    cls: str
    lsb: float = 0.0  # max |fused − reference| in steps, over the outputs
    lsb_ort: float = 0.0  # max |reference − onnxruntime| in steps
    tie: bool = False
    first: str = ""  # first quantized tensor where fused and reference part
    tie_distance: float = -1.0  # there: max |frac(x/s) − 0.5| over the differing elements
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def failed(self) -> bool:
        """Not acceptable: everything but exact, ≤ 1 LSB, and ties however far they grow."""
        return self.cls in FAILURES and not (self.tie and self.cls in ("le3", "worse"))


def lsb_class(lsb: float) -> str:
    return "exact" if lsb < 0.01 else "le1" if lsb < 1.01 else "le3" if lsb < 3.01 else "worse"


def output_steps(model: onnx.ModelProto) -> dict[str, float | None]:
    """Each graph output's quantization step (its producing DequantizeLinear's scale)."""
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    steps: dict[str, float | None] = {}
    for out in model.graph.output:
        node = producer.get(out.name)
        scale = inits.get(node.input[1]) if node is not None and node.op_type == \
            "DequantizeLinear" else None
        steps[out.name] = float(np.max(scale)) if scale is not None and scale.size == 1 \
            else None
    return steps


def steps_apart(a: np.ndarray, b: np.ndarray, step: float | None) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return math.inf
    if a.size == 0:
        return 0.0
    if step is None:
        step = max(float(np.max(np.abs(b))), 1e-6) / 127
    diff = np.abs(a - b)
    if np.any(np.isnan(diff)):
        return math.inf
    return round(float(np.max(diff)) / step, 2)


def ort_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3  # no shape warnings on every run
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds), strict=True))


def _reach(d_up: np.ndarray, shape: tuple[int, ...], moved: bool = False) -> np.ndarray:
    """The elements of a downstream tensor of ``shape`` that a near tie of an absorbed
    upstream quantizer (its distances ``d_up``) may have moved: of the same shape, its own
    positions and every line along one axis through them (an op that mixes one axis:
    Softmax, ...); through an op that changes the shape (a grouped convolution's channels)
    or moves elements (``moved``: a Transpose, whose output may have the same shape), all of
    them if it has any near tie."""
    hot = d_up < TIE_EPS
    if d_up.shape != tuple(shape) or moved:
        return np.full(shape, bool(np.any(hot)))
    near = hot.copy()
    for axis in range(hot.ndim):
        near |= np.any(hot, axis=axis, keepdims=True)
    return near


def first_divergence(model: onnx.ModelProto, feeds: dict[str, np.ndarray],
                     fused: Any) -> tuple[str, bool, float]:
    """(name, is_tie, tie distance) of the first QuantizeLinear output where fused and
    reference part (module docstring). A quantizer the fused plan absorbed (its output is not
    materialized, e.g. between a conv and the Mul fused into it) is checked too: when the
    differing elements sit on a near tie of such an upstream quantizer of the same shape (or,
    through a reshaping op, when that quantizer has any near tie), the case is a tie."""
    from qfuse.compiler.api import compile_model
    from qfuse.compiler.op_check import in_reference_type
    from qfuse.ir import Op
    from qfuse.runtime.reference import evaluate

    graph = compile_model(model, mode="reference").graph
    env = evaluate(graph, feeds, keep=True)
    got = fused.run_all(feeds)

    def steps(node: Any) -> np.ndarray:
        x = env[node.inputs[0]].astype(np.float64)
        s = np.asarray(graph.constant(node.inputs[1]), np.float64)
        if s.ndim == 1 and s.size > 1:
            axis = getattr(node.attrs, "axis", 1) % x.ndim
            s = s.reshape([-1 if i == axis else 1 for i in range(x.ndim)])
        v = x / s
        return np.abs(v - np.floor(v) - 0.5)

    quantizers = [n for n in graph.topo_order() if n.op is Op.QUANTIZE_LINEAR]

    def held(name: str) -> bool:
        """The plan holds this quantizer's integers (a kernel that absorbed the quantize and
        its dequantize writes the float values under the quantizer's name: not comparable as
        integers, so absorbed like one the plan does not write)."""
        return name in got and np.asarray(got[name]).dtype.kind in "iu"

    transposes = [n for n in graph.topo_order() if n.op is Op.TRANSPOSE]

    def moved(up: Any, down: Any) -> bool:
        """A Transpose between ``up`` and ``down``: positions are not comparable."""
        return any(graph.reaches(up, t) and graph.reaches(t, down) for t in transposes)

    def absorbed(down: Any, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """The elements of a tensor of ``shape`` that near ties of the quantizers absorbed
        upstream of ``down`` reach (``_reach``), and each element's distance from them."""
        near_up, distance = np.zeros(shape, bool), np.full(shape, np.inf)
        for up in quantizers:
            if held(up.outputs[0]) or not graph.reaches(up, down):
                continue
            d_up, moves = steps(up), moved(up, down)
            near_up |= _reach(d_up, shape, moves)
            distance = np.minimum(distance, d_up if d_up.shape == shape and not moves
                                  else float(d_up.min()))
        return near_up, distance

    for node in quantizers:
        if not held(node.outputs[0]):
            continue
        ref = env[node.outputs[0]]
        # the plan holds an s8 activation as u8 + 128 where oneDNN has no VNNI (unsigned
        # activations): compared in the reference's type, as `qfuse check` does
        ours = in_reference_type(np.asarray(got[node.outputs[0]]), ref.dtype).astype(np.int64)
        ref = ref.astype(np.int64)
        if ref.shape != ours.shape or np.array_equal(ref, ours):
            continue
        differ = ref != ours
        distance = steps(node)
        near = distance < TIE_EPS
        near_up, upstream = absorbed(node, distance.shape)
        distance = np.minimum(distance, upstream)
        # one step here, or any number of steps grown inside the fused chain from a tie of
        # an absorbed quantizer (its step times the scales between)
        one_step = np.abs(ref - ours) <= 1
        tie = bool(np.all((near & one_step | near_up)[differ]))
        return node.outputs[0], tie, float(np.max(distance[differ]))
    # no materialized quantizer parts: every one on the way was absorbed (an average pool's
    # requantize and a clip's inside one kernel writing the float output); the differing
    # output elements are a tie when each sits on a near tie of such a quantizer
    for name in graph.outputs:
        producer = graph.producer(name)
        if producer is None:
            continue
        ours = np.asarray(got.get(name, env[name]))
        differ = ours != env[name]
        if not np.any(differ):
            continue
        near_up, distance = absorbed(producer, differ.shape)
        if np.any(near_up):
            return f"{name} (absorbed quantizers)", bool(np.all(near_up[differ])), float(
                np.max(distance[differ]))
    return "", False, -1.0


def run_spec(spec: Spec, *, threads: int | None = None) -> Result:
    """Build, compile, run and classify one spec (exceptions become classes, not raised)."""
    model = quantized_model(spec)
    summary = summarize(model, spec)
    return run_model(model, fuzz_inputs(spec), spec.seed, summary, threads=threads)


def summarize(model: onnx.ModelProto, spec: Spec) -> str:
    ops = [n.op_type for n in model.graph.node
           if n.op_type not in ("QuantizeLinear", "DequantizeLinear")]
    q = spec.quant
    if q["kind"] == "ort":
        quant = (f"ort a={q['activation']} w={q['weight']} pc={int(q['per_channel'])} "
                 f"rr={int(q['reduce_range'])} sym={int(q['act_sym'])}{int(q['w_sym'])}")
    elif q["kind"] == "dynamic":
        quant = f"dynamic w={q['weight']} pc={int(q['per_channel'])} rr={int(q['reduce_range'])}"
    else:
        quant = f"hand w={q['weight']} pc={int(q['per_channel'])}"
    return f"{spec.input_shape} {'-'.join(ops)} [{quant}]"


def run_model(model: onnx.ModelProto, feeds: dict[str, np.ndarray], seed: int = -1,
              summary: str = "", *, threads: int | None = None) -> Result:
    from qfuse.compiler.api import compile_model

    try:
        ref = compile_model(model, mode="reference").run(feeds)
    except Exception as exc:  # noqa: BLE001 - classified
        return Result(seed, summary, "reference", message=_one_line(exc))
    try:
        fused = compile_model(model, mode="fused", threads=threads)
    except Exception as exc:  # noqa: BLE001 - classified
        return Result(seed, summary, "compile", message=_one_line(exc))
    try:
        first = fused.run(feeds)
        second = fused.run(feeds)
    except Exception as exc:  # noqa: BLE001 - classified
        return Result(seed, summary, "run", message=_one_line(exc))
    steps = output_steps(model)
    lsb_ort = 0.0
    try:
        theirs = ort_outputs(model, feeds)
        lsb_ort = max(steps_apart(ref[n], theirs[n], steps.get(n)) for n in ref)
    except Exception as exc:  # noqa: BLE001 - onnxruntime refusing is noted, not a class
        summary += f" (onnxruntime: {_one_line(exc)[:80]})"
    for name in first:
        if not np.array_equal(first[name], second[name], equal_nan=True):
            return Result(seed, summary, "nondeterministic", lsb_ort=lsb_ort,
                          lsb=steps_apart(first[name], second[name], steps.get(name)),
                          message=f"output {name}: second run differs from the first")
    lsb = max(steps_apart(first[n], ref[n], steps.get(n)) for n in ref)
    result = Result(seed, summary, lsb_class(lsb), lsb=lsb, lsb_ort=lsb_ort)
    if lsb >= 0.01:
        try:
            result.first, result.tie, result.tie_distance = first_divergence(model, feeds,
                                                                             fused)
        except Exception as exc:  # noqa: BLE001 - the analysis is best effort
            result.message = f"first divergence unknown: {_one_line(exc)}"
    return result


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__
    if type(exc).__module__.startswith("qfuse"):
        return text[:300]
    where = traceback.extract_tb(exc.__traceback__)[-1]
    return f"{text[:240]} (at {where.filename.rsplit('/', 1)[-1]}:{where.lineno})"
