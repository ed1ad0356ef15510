"""Lowering: the passed graph → a Plan of bound oneDNN primitives (and numpy fallbacks).

    from qfuse.compiler.lower import Options, lower
    plan = lower(graph, Options(mode="fused"))
    plan.inspect()

Files: ``table.py`` the one table keyed by op (and the driver, which also folds constant
subgraphs); ``context.py`` value slots, the layout policy and reorder insertion; ``layouts.py``
descriptor helpers; ``attrs.py`` composer result → primitive attributes; ``lower_compute.py``
(Conv, ConvTranspose; ``padded_depthwise.py`` its depthwise form over a padded u8 source),
``lower_matmul.py`` (MatMul, Gemm), ``lower_quant.py`` (quantize,
dequantize, requantize reorders), ``lower_pool.py``, ``lower_misc.py`` (float elementwise,
batch norm, data movement), ``lower_norm.py`` (softmax, layer norm, float or int8), ``unfused.py`` (the `unfused` mode's chain of primitives),
``fallback.py`` (numpy kernels); ``plan.py`` the Plan, buffer planning and binding.
``runtime/executor.py`` runs a Plan.
"""

from __future__ import annotations

from qfuse.compiler.lower.context import Options
from qfuse.compiler.lower.plan import Kernel, Plan, Slot, plan_buffers
from qfuse.compiler.lower.table import LOWERINGS, LoweringError, lower

__all__ = ["LOWERINGS", "Kernel", "LoweringError", "Options", "Plan", "Slot", "lower",
           "plan_buffers"]
