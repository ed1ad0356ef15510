"""The user's own float model as the reference of ``qfuse inspect --error --float FP32.onnx``.

A *shadow model* (Caffe2 DNNLOWP's float shadow, here the whole float model): the float ONNX
model run by onnxruntime with every intermediate tensor added as a graph output (graph
optimizations off, so no tensor is fused away or renamed), on the same feeds as the quantized
model. Its tensors are matched to the quantized model's quantizers by name:

- the tensor a QuantizeLinear reads keeps its float name in the tools that write QDQ:
  onnxruntime's ``quantize_static`` puts ``X -> QuantizeLinear -> X_QuantizeLinear_Output ->
  DequantizeLinear -> X_DequantizeLinear_Output`` after a tensor ``X``; when it removes a Relu /
  Clip (its QDQRemovableActivation) it renames the producer's output to the activation's
  output name, so ``X`` is the activation's output; a graph output ``Y`` is quantized as
  ``Y_QuantizeLinear_Input -> ... -> Y``. NNCF's QuantizeLinear reads ``X`` too
  (``X -> q_output_X_1``). QOperator models (``QLinearConv`` writing ``X_quantized``) come
  through qfuse's importer as QuantizeLinear nodes whose output is ``X_quantized`` (its
  QSplit writes ``Xquantized``).
- so the candidates for quantizer ``q`` are its input's name, that name without the
  ``_QuantizeLinear_Input`` suffix, and its output's name without ``_quantized`` or
  ``quantized``;
- QOperator quantize_static folds a Relu / Clip into the quantizer without renaming (the
  quantizer reads the Conv's output name ``X`` with the activation's range): when the float
  tensor ``X``'s only reader is a Relu or Clip and the quantizer's range starts at real 0
  (zero point = qmin), the reference is that activation's output.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from qfuse.compiler.errors import InputError

__all__ = ["FloatModel", "candidates"]

ACTIVATIONS = ("Relu", "Clip")


def candidates(q_input: str, q_output: str) -> list[str]:
    """Float tensor names that may hold the value quantizer (q_input -> q_output) quantizes."""
    names = [q_input]
    for name, suffixes in ((q_input, ("_QuantizeLinear_Input",)),
                           (q_output, ("_quantized", "quantized"))):
        suffix = next((x for x in suffixes if name.endswith(x) and len(name) > len(x)), None)
        if suffix is not None:
            names.append(name[: -len(suffix)])
    return list(dict.fromkeys(names))


class FloatModel:
    """The float model at ``path``, every intermediate tensor an output (module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        model = onnx.load(str(self.path))
        graph = model.graph
        initializers = {i.name for i in graph.initializer}
        self.inputs = [v.name for v in graph.input if v.name not in initializers]
        produced = [o for n in graph.node if n.op_type != "Constant" for o in n.output if o]
        known = {o.name for o in graph.output}
        graph.output.extend(onnx.ValueInfoProto(name=n) for n in dict.fromkeys(produced)
                            if n not in known)
        readers: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.node:
            for name in node.input:
                readers.setdefault(name, []).append(node)
        # tensor -> the output of the Relu / Clip that is its only reader
        self.activation_after = {name: nodes[0].output[0] for name, nodes in readers.items()
                                 if len(nodes) == 1 and nodes[0].op_type in ACTIVATIONS}
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.log_severity_level = 3
        try:
            self._session = ort.InferenceSession(model.SerializeToString(), options,
                                                 providers=["CPUExecutionProvider"])
        except Exception as exc:  # noqa: BLE001  onnxruntime raises its own exception types
            raise InputError(f"--float {self.path}: onnxruntime cannot load it: "
                             f"{str(exc).splitlines()[0]}") from exc
        self.names = [o.name for o in self._session.get_outputs()]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Every tensor of the float model on ``feeds`` (the quantized model's inputs)."""
        missing = [n for n in self.inputs if n not in feeds]
        if missing:
            raise InputError(f"--float {self.path}: its inputs {missing} are not inputs of the "
                             f"quantized model (which has {sorted(feeds)})")
        own = {n: feeds[n] for n in self.inputs}
        values = self._session.run(None, own)
        found = {name: v for name, v in zip(self.names, values, strict=True)
                 if isinstance(v, np.ndarray)}
        return {**own, **found}
