"""The Executor: feed validation, output copies, repeated runs, threads, run_all."""

from __future__ import annotations

import numpy as np
import pytest

from qfuse.ir import DType, Graph
from qfuse.runtime.executor import Executor
from tests.compiler.lower_helpers import (
    add_int8_conv,
    int_input,
    lower_built,
    random_int,
    ref_eval,
    requires_exact_int8,
)

U8 = DType.U8


@pytest.fixture(scope="module")
def model() -> tuple[Graph, Executor]:
    g = Graph("exec")
    x = int_input(g, "x", (1, 16, 6, 6), U8, 0.05, 3)
    y = add_int8_conv(g, x, 16, name="c0").outputs[0]
    g.outputs.append(add_int8_conv(g, y, 8, name="c1", seed=1).outputs[0])
    return g, Executor(lower_built(g))


def _feeds(seed: int = 0) -> dict[str, np.ndarray]:
    return {"x": random_int(np.random.default_rng(seed), (1, 16, 6, 6), U8)}


@pytest.mark.parametrize("feeds,match", [
    ({}, "input 'x' is missing"),
    ({"x": np.zeros((1, 16, 6, 6), np.uint8), "y": np.zeros(1)}, r"unknown input\(s\) \['y'\]"),
    ({"x": np.zeros((1, 16, 6, 5), np.uint8)}, r"input 'x': got uint8\[1, 16, 6, 5\]"),
    ({"x": np.zeros((1, 16, 6, 6), np.float32)}, r"input 'x': got float32"),
    ({"x": [[1, 2]]}, "input 'x' must be a numpy array"),
])
def test_invalid_feeds_raise(model: tuple[Graph, Executor], feeds: dict, match: str) -> None:
    _, executor = model
    with pytest.raises(ValueError, match=match):
        executor.run(feeds)


def test_outputs_are_copies_and_runs_repeat(model: tuple[Graph, Executor]) -> None:
    graph, executor = model
    first = executor.run(_feeds(0))
    out = graph.outputs[0]
    kept = first[out].copy()
    first[out][...] = 0  # the caller owns its copy
    other = executor.run(_feeds(1))
    again = executor.run(_feeds(0))
    np.testing.assert_array_equal(again[out], kept)
    assert not np.array_equal(other[out], kept)
    assert again[out].flags.c_contiguous


@requires_exact_int8
def test_threads_and_reference(model: tuple[Graph, Executor]) -> None:
    graph, executor = model
    single = Executor(executor.plan, threads=1).run(_feeds(2))
    default = executor.run(_feeds(2))
    out = graph.outputs[0]
    np.testing.assert_array_equal(single[out], default[out])
    ref = ref_eval(graph, _feeds(2))[out]
    assert np.abs(single[out].astype(int) - ref.astype(int)).max() <= 1
    with pytest.raises(ValueError, match="threads"):
        Executor(executor.plan, threads=0)


def test_run_all_gives_intermediates(model: tuple[Graph, Executor]) -> None:
    graph, executor = model
    values = executor.run_all(_feeds(3))
    middle = graph.node("c0").outputs[0]
    assert middle in values and values[middle].dtype == np.uint8
    np.testing.assert_array_equal(values[graph.outputs[0]],
                                  executor.run(_feeds(3))[graph.outputs[0]])
