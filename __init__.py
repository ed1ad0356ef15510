"""qfuse: compile quantized ONNX models into fused oneDNN int8 kernels.

The public Python surface::

    import qfuse
    model = qfuse.compile_model("model.qdq.onnx")          # mode="fused" by default
    outputs = model.run({"input": x})                        # dict of numpy arrays
    model.inspect()                                          # what fused, what did not, and why
    qfuse.quantize("model.onnx", "calib.npz", "model.int8.onnx")  # float → int8 QDQ

The repository's folders are this package's subpackages: ``qfuse.ir`` (the graph), ``qfuse.compiler``
(importer, pipeline, lowering, API, CLI), ``qfuse.passes`` (one rewrite a module) and
``qfuse.runtime`` (oneDNN binding, executor, reference interpreter, numerics).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("qfuse")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

from qfuse.compiler.api import CompiledModel, compile_model, import_graph
from qfuse.compiler.nonfinite import NonFiniteInputWarning
from qfuse.compiler.quantize import quantize

__all__ = ["CompiledModel", "NonFiniteInputWarning", "__version__", "compile_model",
           "import_graph", "quantize"]
