"""How a quantized model fares once compiled: kernels, unmatched nodes, closeness to float.

Used by benchmarks/quantize_compare.py and the zoo tests to compare quantizers:

- ``kernels``: kernels of the fused qfuse plan; ``vnni_kernels``: the same without the low
  halves that compiler/lower/no_vnni.py adds on CPUs without VNNI (named ``...:lo``), i.e.
  what a VNNI / AMX CPU runs — whether a kernel is split depends on the oneDNN implementation
  chosen, so the raw count on such a CPU also measures the lowering, not only the placement;
- ``unmatched``: nodes of the quantized region that ``not_fused`` reports as
  "no pass matched" (compiler/fusion_report.py);
- ``min_cos`` / ``mean_cos``: cosine similarity (runtime/numerics) of qfuse fused against
  the float model run by ONNX Runtime, over ``inputs``, on the first output;
- ``agree`` (with a ``task``): the mean over ``inputs`` of realzoo/table.py's ``agreement``
  (the task's own decision of qfuse fused against the float model's).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx


def measure(model: onnx.ModelProto, float_model: onnx.ModelProto,
            inputs: list[dict[str, np.ndarray]], task: str | None = None) -> dict[str, Any]:
    import onnxruntime as ort

    from qfuse.compiler.api import compile_model
    from qfuse.compiler.fusion_report import quantized_region
    from qfuse.runtime.numerics.error import cosine

    ref = ort.InferenceSession(float_model.SerializeToString(),
                               providers=["CPUExecutionProvider"])
    compiled = compile_model(model)
    info = compiled.inspect()
    region = quantized_region(compiled.compiled_graph)
    unmatched = [d for d in info["not_fused"]
                 if d["node"] in region and d["reason"] == "no pass matched"]
    out = compiled.outputs[0]
    pairs = [(ref.run([out], x)[0], compiled.run(x)[out]) for x in inputs]
    cos = [cosine(r, g) for r, g in pairs]
    kernels = [k["name"] for k in info["kernels"]]
    result = {"kernels": len(kernels),
              "vnni_kernels": sum(not k.endswith(":lo") for k in kernels),
              "unmatched": unmatched, "min_cos": min(cos), "mean_cos": float(np.mean(cos))}
    if task is not None:
        from qfuse.examples.realzoo.table import agreement

        result["agree"] = float(np.mean([agreement(task, r, g) for r, g in pairs]))
    return result
