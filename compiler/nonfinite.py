"""NaN and infinity in float graph inputs: ONNX's result in every mode, and a warning.

What ONNX Runtime gives (measured, onnxruntime 1.32, u8 and s8, any zero point, scalar and
vector code paths): ``QuantizeLinear(NaN) = qmin``, ``QuantizeLinear(+inf) = qmax``,
``QuantizeLinear(-inf) = qmin``. qfuse's reference interpreter does the same. oneDNN does not
for NaN: its f32 -> s8 conversion saturates with max/min instructions that let NaN through as
the upper bound, so an s8 input quantizer gave +127 where ONNX gives -128 (u8 happened to
give 0); ±inf saturate correctly.

So, once per run, every float graph input is checked (``all_finite``: ``np.isfinite(x).all()``,
single-threaded: 36–41 µs for a 1x3x224x224 input on this project's 2-core test machine, under
load; a BLAS dot product of x with itself is finite exactly when x is, unless it overflows,
and took 29–33 µs, but OpenBLAS may run it on threads that then spin next to oneDNN's). When
one holds NaN or inf:

- a ``NonFiniteInputWarning`` is issued, once per CompiledModel;
- fused / unfused, an input whose every reader is a QuantizeLinear: its NaN are replaced by
  -inf (in a copy). -inf quantizes to qmin in oneDNN as NaN does in ONNX, so the compiled
  kernels give ONNX's result at full speed;
- fused / unfused, an input read by anything else (a float op, a FakeQuantize): that run
  goes to the reference interpreter (exact ONNX semantics, slow), since NaN then flows
  through float arithmetic before any quantization;
- reference: nothing changes (it is ONNX's semantics already);
- fp32 (quantization stripped): the float model's ONNX semantics, where NaN and inf
  propagate as IEEE float32 does (onnxruntime running the float model does the same). oneDNN's
  fused eltwise post-ops do not (its ReLU maps NaN to 0), so such runs go to the reference
  interpreter on the stripped graph; an input the stripped graph still only quantizes (a
  quantizer that is part of the interface) has its NaN replaced by -inf as above.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable

import numpy as np

from qfuse.ir import Graph, Op
from qfuse.ir.mode import Mode

log = logging.getLogger(__name__)

__all__ = ["NonFiniteGuard", "NonFiniteInputWarning", "all_finite"]

Feeds = dict[str, np.ndarray]


class NonFiniteInputWarning(RuntimeWarning):
    """A float graph input held NaN or infinity (README, "NaN and infinity in inputs")."""


def all_finite(x: np.ndarray) -> bool:
    """True when no element of the float array ``x`` is NaN or ±inf (module docstring)."""
    return bool(np.isfinite(x).all())


class NonFiniteGuard:
    """Checks a CompiledModel's float inputs before each run (module docstring)."""

    def __init__(self, graph: Graph, mode: Mode, fallback: Callable[[Feeds], Feeds] | None,
                 compiled: Graph | None = None,
                 validate: Callable[[Feeds], None] | None = None) -> None:
        """``graph``: the imported graph; ``compiled``: the graph the fp32 mode lowered;
        ``validate``: the executor's check of the feeds (an InputError for a bad one), run
        before a rerouted run as before a compiled one."""
        self.name = graph.name or "model"
        self.mode = mode
        self.float_inputs = [n for n in graph.inputs if graph.info(n).dtype.np.kind == "f"]
        readers = compiled if mode is Mode.FP32 and compiled is not None else graph
        self.quantized_only = {n for n in self.float_inputs
                               if readers.consumers(n) and all(
                                   r.op is Op.QUANTIZE_LINEAR for r, _ in readers.consumers(n))}
        self.fallback = fallback
        self.validate = validate
        self.warned = False

    def __call__(self, feeds: Feeds, run: Callable[[Feeds], Feeds]) -> Feeds:
        bad = [n for n in self.float_inputs
               if isinstance(feeds.get(n), np.ndarray) and feeds[n].dtype.kind == "f"
               and not all_finite(feeds[n])]
        if not bad:
            return run(feeds)
        compiled = self.mode is not Mode.REFERENCE
        reroute = compiled and any(n not in self.quantized_only for n in bad)
        self._warn(bad, reroute)
        if reroute and self.fallback is not None:
            if self.validate is not None:
                self.validate(feeds)
            with np.errstate(invalid="ignore", over="ignore"):
                return self.fallback(feeds)
        replace = [n for n in bad if n in self.quantized_only and self.mode is not Mode.REFERENCE]
        if replace:
            feeds = dict(feeds)
            for name in replace:
                feeds[name] = np.where(np.isnan(feeds[name]), -np.inf, feeds[name]).astype(
                    feeds[name].dtype)
        return run(feeds)

    def _warn(self, bad: list[str], reroute: bool) -> None:
        if self.warned:
            return
        self.warned = True
        what = {Mode.REFERENCE: "ONNX's result (QuantizeLinear: NaN and -inf give qmin, +inf "
                                "qmax, as onnxruntime)",
                Mode.FP32: "the float model's ONNX result (NaN and inf propagate; quantization "
                           "is stripped in fp32 mode)" + ("; these runs use the reference "
                                                          "interpreter (slow)" if reroute
                                                          else "")}.get(
            self.mode, "ONNX's result (QuantizeLinear: NaN and -inf give qmin, +inf qmax, as "
                       "onnxruntime)" + ("; these runs use the reference interpreter (slow), "
                                         "as the input reaches float ops" if reroute else ""))
        warnings.warn(f"{self.name}: input(s) {bad} hold NaN or infinity; {self.mode} mode "
                      f"gives {what}. Warned once per compiled model.",
                      NonFiniteInputWarning, stacklevel=3)
