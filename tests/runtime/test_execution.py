"""runtime/execution.py's run loop: the pre-converted calls (``calls``) against the closures
(``runs``, what profiling and run_all use), and the error a failing primitive raises."""

from __future__ import annotations

import numpy as np
import pytest

from qfuse.compiler.api import compile_model, random_inputs
from qfuse.examples import zoo
from qfuse.runtime.execution import ExecutionContext
from qfuse.runtime.onednn import DnnlError


def _outputs(context: ExecutionContext, feeds: dict[str, np.ndarray], loop: str
             ) -> dict[str, np.ndarray]:
    for name, view in context.inputs:
        np.copyto(view, feeds[name])
    if loop == "calls":
        context.run()
    else:
        for run in context.runs:
            run()
        context.stream.wait()
    return {name: view.copy() for name, view in context.outputs}


@pytest.mark.parametrize("name", ["mobilenetv2", "transformer"])
def test_the_run_loop_computes_what_the_closures_do(name: str) -> None:
    model = compile_model(zoo.model_path(name, quantized=True), threads=2)
    feeds = random_inputs(model, seed=2)
    context = ExecutionContext(model.plan)
    assert len(context.calls) == len(context.runs) == len(model.plan.kernels)
    want = _outputs(context, feeds, "runs")
    got = _outputs(ExecutionContext(model.plan), feeds, "calls")
    assert want.keys() == got.keys()
    assert all(np.array_equal(want[k], got[k]) for k in want)


def test_a_failing_primitive_raises_naming_its_kernel() -> None:
    model = compile_model(zoo.model_path("mobilenetv2", quantized=True), threads=2)
    context = ExecutionContext(model.plan)
    index = next(i for i, k in enumerate(model.plan.kernels) if k.primitive is not None)
    _, arguments = context.calls[index]
    context.calls[index] = (lambda *_: 3, arguments)  # dnnl_unimplemented
    with pytest.raises(DnnlError, match=model.plan.kernels[index].name):
        context.run()
