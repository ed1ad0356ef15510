"""``qfuse compare MODEL --emulate X`` and ``qfuse run MODEL --emulate X``.

compare: for every quantized tensor of the model (each QuantizeLinear output of the imported
graph, by ONNX name, in topological order) it runs the model twice on the same inputs — once
emulating framework X's integer arithmetic (runtime.emulate), once as qfuse computes it (the
*baseline*) — and reports the share of identical elements and the largest difference in LSB
(quantization steps of that tensor). ``first_divergence`` is the first tensor, in topological
order, that is not 100 % identical; everything after it may differ only because its inputs do.

Baselines (``--against``):

- ``fused``: the compiled fused model (oneDNN), when ``compile_model(mode="fused")`` works and
  its CompiledModel exposes the quantized intermediates through ``run_all(feeds)`` (a dict
  keyed by ONNX value name). Tensors the fused plan does not materialize are listed as such.
- ``reference``: the reference interpreter on the imported graph (exact ONNX semantics).

Without ``--against``, fused is used when available, else reference; the output says which.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from qfuse.compiler.api import CompiledModel, compile_model, random_inputs
from qfuse.compiler.cli_output import emit
from qfuse.compiler.errors import InputError, UnsupportedModelError
from qfuse.compiler.files import load_npz
from qfuse.runtime.emulate import Decision, emulate, plan

__all__ = ["Row", "compare", "emulated_model", "load_feeds", "main_compare"]


@dataclass(frozen=True)
class Row:
    name: str
    identical: float | None  # None: the baseline does not materialize the tensor
    max_lsb: int | None
    emulation: str


def emulated_model(model: str | Path, framework: str) -> CompiledModel:
    """A CompiledModel whose ``run`` emulates ``framework`` (graph outputs only)."""
    base = compile_model(model, mode="reference")
    graph = base.graph
    decisions = plan(graph, framework)
    return CompiledModel(
        graph,
        f"emulate:{framework}",
        lambda feeds: emulate(graph, feeds, framework, keep=False, decisions=decisions),
        {"decisions": decisions},
    )


def load_feeds(model: CompiledModel, path: Path | None) -> dict[str, np.ndarray]:
    """Feeds from an .npz keyed by input name, or random inputs (seed 0) without one."""
    if path is None:
        return random_inputs(model, seed=0)
    feeds = {name: array for name, array in load_npz(path).items() if name in model.inputs}
    missing = [n for n in model.inputs if n not in feeds]
    if missing:
        raise InputError(f"{path} lacks model inputs {missing}")
    return feeds


def _baseline(model_path: Path, feeds: dict[str, np.ndarray], reference: CompiledModel,
              against: str | None) -> tuple[str, dict[str, np.ndarray]]:
    """(description, tensors) of the baseline the emulation is compared with."""
    why = ""
    if against in (None, "fused"):
        try:
            fused = compile_model(model_path, mode="fused")
            run_all = getattr(fused, "run_all", None)
            if run_all is None:
                raise NotImplementedError("the fused CompiledModel does not expose "
                                          "intermediate tensors (no run_all)")
            return "fused (oneDNN)", dict(run_all(feeds))
        except (NotImplementedError, UnsupportedModelError) as exc:
            if against == "fused":
                raise
            why = f" (fused unavailable: {exc})"
    from qfuse.runtime.reference import evaluate

    return f"reference interpreter{why}", evaluate(reference.graph, feeds, keep=True)


def compare(model_path: Path, framework: str, *, inputs: Path | None = None,
            against: str | None = None) -> dict[str, Any]:
    """The comparison as a JSON-ready dict (``tensors``, ``first_divergence``, ...)."""
    reference = compile_model(model_path, mode="reference")
    feeds = load_feeds(reference, inputs)
    decisions: list[Decision] = plan(reference.graph, framework)
    emulated = emulate(reference.graph, feeds, framework, keep=True, decisions=decisions)
    baseline, tensors = _baseline(model_path, feeds, reference, against)
    rows = []
    for d in decisions:
        ours = tensors.get(d.tensor)
        if ours is None:
            rows.append(Row(d.tensor, None, None, d.summary()))
            continue
        a, b = emulated[d.tensor].astype(np.int64), np.asarray(ours).astype(np.int64)
        if a.shape != b.shape:
            raise ValueError(f"tensor '{d.tensor}': emulation {a.shape}, baseline {b.shape}")
        same = float(np.mean(a == b)) if a.size else 1.0
        lsb = int(np.max(np.abs(a - b))) if a.size else 0
        rows.append(Row(d.tensor, same, lsb, d.summary()))
    first = next((r.name for r in rows if r.identical is not None and r.identical < 1), None)
    return {
        "model": str(model_path),
        "framework": framework,
        "baseline": baseline,
        "inputs": str(inputs) if inputs else "random (seed 0)",
        "tensors": [r.__dict__ for r in rows],
        "first_divergence": first,
    }


def _percent(share: float) -> str:
    """``share`` as a percentage; never shows 100.00 % for a tensor that is not identical."""
    value = 100 * share
    return f"{min(value, 99.99) if share < 1 else value:.2f} %"


def format_text(result: dict[str, Any]) -> str:
    rows = result["tensors"]
    width = max([len("tensor")] + [len(r["name"]) for r in rows])
    lines = [
        f"emulating {result['framework']} vs {result['baseline']}; inputs: {result['inputs']}",
        f"{'tensor':<{width}}  {'identical':>9}  {'max LSB':>7}  emulation",
    ]
    for r in rows:
        if r["identical"] is None:
            same, lsb = "n/a", "n/a"
        else:
            same, lsb = _percent(r["identical"]), str(r["max_lsb"])
        lines.append(f"{r['name']:<{width}}  {same:>9}  {lsb:>7}  {r['emulation']}")
    first = result["first_divergence"]
    if first is None:
        lines.append("first divergence: none (every tensor identical)")
    else:
        row = next(r for r in rows if r["name"] == first)
        lines.append(f"first divergence: {first} ({_percent(row['identical'])} identical, "
                     f"max {row['max_lsb']} LSB)")
    return "\n".join(lines)


def main_compare(args: argparse.Namespace) -> int:
    result = compare(args.model, args.emulate, inputs=args.inputs, against=args.against)
    emit(args.json, result, lambda: format_text(result))
    return 0
