"""Checking float islands: a model imports with the islands expected, for the reason expected,
and runs in reference and fused mode as onnxruntime runs the whole model."""

from __future__ import annotations

import re

import numpy as np
import onnx
from onnx_builders import run_ort

from qfuse.compiler.api import compile_model, random_inputs
from qfuse.compiler.onnx_import import import_model
from qfuse.ir import Graph, Node, Op


def islands(graph: Graph) -> list[Node]:
    return [n for n in graph if n.op is Op.ISLAND]


def assert_island(m: onnx.ModelProto, ops: set[str], reason: str, *, run: bool = True,
                  feeds: dict[str, np.ndarray] | None = None) -> Node:
    """``m`` imports with exactly one island, of ``ops``, whose reason matches ``reason``;
    with ``run``, reference and fused mode give onnxruntime's outputs (float32 rounding)."""
    found = islands(import_model(m))
    assert len(found) == 1, [n.attrs.ops for n in found]
    island = found[0]
    assert set(island.attrs.ops) == ops, island.attrs.ops
    assert re.search(reason, island.attrs.reason), island.attrs.reason
    if run:
        compiled = {mode: compile_model(m, mode=mode) for mode in ("reference", "fused")}
        feeds = feeds or random_inputs(compiled["reference"], seed=1)
        want = run_ort(m, feeds, optimized=False)
        for mode, model in compiled.items():
            got = model.run(feeds)
            for name, expected in zip(model.outputs, want, strict=True):
                assert got[name].dtype == expected.dtype, (mode, name)
                np.testing.assert_allclose(got[name], expected, rtol=1e-5, atol=1e-6,
                                           err_msg=f"{mode} {name}")
    return island
