"""Which kernels' differences move the model's output (``qfuse check --blame``).

``op_check`` says how far each kernel is from exact QDQ when fed exact QDQ's inputs. A kernel
one step off on a handful of values can still move the output a lot, because a network may
amplify one-step differences; this module measures that, per value, with the output cosine
``a.b / (|a| |b|)`` against the reference's output:

- injected: the reference (onnxruntime, ORT_DISABLE_ALL) run with that one value replaced by
  the plan's teacher-forced value (the model with the tensor made a graph input), so every
  later op is the reference's own arithmetic: how much that kernel's own difference alone
  costs;
- fixed: the plan run with that one value forced to the reference's (``Executor.run_forced``),
  every other kernel its own: what the plan would reach without that kernel's difference (a
  forced value also stops every earlier difference that reaches the output only through it,
  so a late value's fixed cosine says how much arrives through it, not what its kernel did);
- all fixed: the plan with every differing value forced to the reference's;
- sensitivity: the reference run with ``k`` random elements of one integer value moved by one
  step (random sign, clipped to the dtype), over random draws: how far ``k`` one-step
  differences in that value move the output whichever engine makes them.

A value is compared (and forced) where the plan materializes it with the reference's name,
shape and dtype (``op_check``'s "reference" rows; an s8 tensor the plan holds as u8 + 128 is
compared and injected shifted, ``op_check.in_plan_type``; values only the compiled graph has
are not injected: the reference has no tensor to replace).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import onnx

from qfuse.compiler.api import CompiledModel, ModelLike, compile_model
from qfuse.compiler.op_check import (
    in_plan_type,
    in_reference_type,
    level_offset,
    reference_values,
)
from qfuse.runtime.numerics import cosine

__all__ = ["Blame", "BlameRow", "blame", "format_blame", "reference_with", "sensitivity"]


@dataclass(frozen=True)
class BlameRow:
    tensor: str
    dtype: str
    elements: int
    differing: int
    injected: float  # the reference's output cosine with only this value the plan's
    fixed: float  # the plan's output cosine with only this value the reference's


@dataclass
class Blame:
    output: str
    cos_plan: float  # the plan's own output against the reference's
    cos_all_fixed: float  # every differing value forced to the reference's
    rows: list[BlameRow] = field(default_factory=list)
    sensitivity: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"output": self.output, "cos_plan": self.cos_plan,
                "cos_all_fixed": self.cos_all_fixed, "rows": [asdict(r) for r in self.rows],
                "sensitivity": self.sensitivity}


class ReferenceFrom:
    """The reference model with some tensors made graph inputs: onnxruntime, ORT_DISABLE_ALL,
    each tensor's producer writing a renamed output nobody reads, so the fed value is what
    every consumer reads and everything after it is the reference's own arithmetic."""

    def __init__(self, model: onnx.ModelProto, cut: Mapping[str, np.ndarray]) -> None:
        import onnxruntime as ort

        m = onnx.ModelProto.FromString(model.SerializeToString())
        for node in m.graph.node:
            for i, name in enumerate(node.output):
                if name in cut:
                    node.output[i] = f"{name}:cut"
        m.graph.input.extend(
            onnx.helper.make_tensor_value_info(
                name, onnx.helper.np_dtype_to_tensor_dtype(value.dtype), value.shape)
            for name, value in cut.items())
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.log_severity_level = 3
        self.session = ort.InferenceSession(m.SerializeToString(), options,
                                            providers=["CPUExecutionProvider"])
        self.inputs = {i.name for i in self.session.get_inputs()}

    def run(self, feeds: Mapping[str, np.ndarray], output: str) -> np.ndarray:
        return self.session.run([output], {k: v for k, v in feeds.items() if k in self.inputs}
                                )[0]


def reference_with(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
                   values: Mapping[str, np.ndarray], output: str) -> np.ndarray:
    """The reference's ``output`` with the tensors in ``values`` replaced (ReferenceFrom)."""
    return ReferenceFrom(model, values).run({**feeds, **values}, output)


def _forceable(compiled: CompiledModel, reference: Mapping[str, np.ndarray]
               ) -> dict[str, np.ndarray]:
    """The reference's values that the plan materializes with the same shape and dtype."""
    graph, plan = compiled.compiled_graph, compiled.plan
    found = {}
    for value in plan.homes:
        if value in plan.inputs or value not in graph.values or value not in reference:
            continue
        info = graph.info(value)
        ref = in_plan_type(np.asarray(reference[value]), info, graph.channel_orders.get(value),
                           level_offset(graph, value))
        if info.shape == ref.shape and info.dtype.np == ref.dtype:
            found[value] = np.ascontiguousarray(ref)
    return found


def _load(model: ModelLike) -> onnx.ModelProto:
    return model if isinstance(model, onnx.ModelProto) else onnx.load(str(model))


def blame(model: ModelLike, feeds: Mapping[str, np.ndarray], *,
          compiled: CompiledModel | None = None, reference_model: ModelLike | None = None,
          output: str | None = None, reference: Mapping[str, np.ndarray] | None = None,
          draws: int = 0, seed: int = 0) -> Blame:
    """Per value the teacher-forced plan computes differently from the reference: its
    injected and fixed output cosines (module docstring). ``draws`` > 0: the sensitivity of
    the value with the lowest injected cosine, ``k`` = its differing count."""
    if compiled is None:
        compiled = compile_model(model, mode="fused")
    proto = _load(reference_model if reference_model is not None else model)
    if reference is None:
        reference = reference_values(proto, feeds)
    output = output or compiled.outputs[0]
    want = np.asarray(reference[output])
    forced = _forceable(compiled, reference)
    taught = compiled.executor.run_forced(dict(feeds), forced)
    differing = {v: taught[v] for v, ref in forced.items()
                 if v in taught and not np.array_equal(taught[v], ref)}
    run = compiled.executor.run_forced
    # the output's own row: forcing it changes nothing the plan reports (run_forced keeps the
    # plan's value), so its fixed cosine is 1 by definition and it is not forced below
    upstream = {v: forced[v] for v in differing if v != output}
    result = Blame(output, cosine(want, compiled.run(dict(feeds))[output]),
                   cosine(want, run(dict(feeds), upstream)[output]))
    for value, mine in differing.items():
        last = value == output
        result.rows.append(BlameRow(
            value, str(mine.dtype), int(mine.size),
            int(np.count_nonzero(mine != forced[value])),
            cosine(want, mine if last else reference_with(
                proto, feeds, {value: in_reference_type(
                    mine, reference[value].dtype,
                    compiled.compiled_graph.channel_orders.get(value),
                    level_offset(compiled.compiled_graph, value))},
                output)),
            1.0 if last else cosine(want, run(dict(feeds), {value: forced[value]})[output])))
    ints = [r for r in result.rows if np.dtype(r.dtype).kind in "iu"]
    if draws and ints:
        worst = min(ints, key=lambda r: r.injected)
        cosines = sensitivity(proto, feeds, worst.tensor, worst.differing, draws, seed,
                              reference=reference, output=output)
        result.sensitivity = {"tensor": worst.tensor, "k": worst.differing, "draws": draws,
                              "min": float(cosines.min()), "median": float(np.median(cosines)),
                              "max": float(cosines.max()),
                              "below_plan": float(np.mean(cosines < result.cos_plan))}
    return result


def sensitivity(model: ModelLike, feeds: Mapping[str, np.ndarray], tensor: str, k: int,
                draws: int, seed: int = 0, *, reference: Mapping[str, np.ndarray] | None = None,
                output: str | None = None) -> np.ndarray:
    """The reference's output cosines, one per draw, with ``k`` random elements of integer
    ``tensor`` moved one step (random sign, clipped to its dtype)."""
    proto = _load(model)
    if reference is None:
        reference = reference_values(proto, feeds)
    output = output or proto.graph.output[0].name
    base = np.asarray(reference[tensor])
    limits = np.iinfo(base.dtype)
    cut = ReferenceFrom(proto, {tensor: base})
    rng = np.random.default_rng(seed)
    found = []
    for _ in range(draws):
        moved = base.astype(np.int64).ravel()
        where = rng.choice(moved.size, k, replace=False)
        moved[where] = np.clip(moved[where] + rng.choice([-1, 1], k), limits.min, limits.max)
        got = cut.run({**feeds, tensor: moved.reshape(base.shape).astype(base.dtype)}, output)
        found.append(cosine(np.asarray(reference[output]), got))
    return np.array(found)


def format_blame(result: Blame) -> str:
    rows = sorted(result.rows, key=lambda r: r.injected)
    width = max([len("tensor")] + [len(r.tensor) for r in rows])
    lines = [f"output '{result.output}': plan cosine {result.cos_plan:.5f} against the "
             f"reference; with every differing value forced to the reference's "
             f"{result.cos_all_fixed:.5f}",
             f"{'tensor':<{width}}  {'dtype':>7}  {'differ':>9}  {'injected':>8}  {'fixed':>8}"]
    lines += [f"{r.tensor:<{width}}  {r.dtype:>7}  {r.differing:>9}  {r.injected:>8.5f}  "
              f"{r.fixed:>8.5f}" for r in rows]
    lines.append("injected: the reference with only this value the plan's (teacher-forced); "
                 "fixed: the plan with only this value the reference's")
    s = result.sensitivity
    if s:
        lines.append(f"sensitivity: {s['k']} random one-step changes in '{s['tensor']}', "
                     f"{s['draws']} draws: reference cosine min {s['min']:.5f}, median "
                     f"{s['median']:.5f}, max {s['max']:.5f}; {100 * s['below_plan']:.0f} % "
                     f"below the plan's")
    return "\n".join(lines)
