"""compose_post_ops: the composer's oneDNN mapping recorded on every fused node.

Numerics: ``reference_composed`` evaluates each fused node as oneDNN is asked to (weight
scales, bias, post-ops, dst scale / zero point: runtime/reference/chain.py apply_composed)
and is compared with the chain semantics. The composer folds constants (products of scales
computed once), so a value within float32 rounding of a .5 tie may round the other way:
≤ 1 LSB on ≥ 99.9 % identical elements. drop_inner_round removes a rounding on purpose and is
only checked to fire.
"""

from __future__ import annotations

import numpy as np
import pytest
from fusion_helpers import (
    C,
    add,
    const,
    feeds_for,
    fq,
    int8_conv,
    new_graph,
    reference,
    reference_composed,
    residual_block,
    run,
)

from qfuse.ir import Graph, Op
from qfuse.ir.chain import Fused, Residual, Scale, Shift
from qfuse.ir.postops import Composed, ComposerOptions, Eltwise, Sum
from qfuse.passes import compose_post_ops, fuse_bias, fuse_post_ops
from qfuse.passes.base import PassContext, PassError
from qfuse.runtime.numerics import step_diff


def golden() -> Graph:
    graph = new_graph(shape=(2, 4, 12, 12))
    int8_conv(graph, bias=False)
    add(graph, Op.ADD, ["conv", const(graph, "b", np.ones((1, C, 1, 1)))], "biased")
    add(graph, Op.RELU, ["biased"], "relu")
    fq(graph, "relu", "y", 0.02, 0)
    graph.outputs.append("y")
    return graph


def test_records_the_mapping_and_the_optimizations() -> None:
    graph = golden()
    feeds = feeds_for(graph)
    before = reference(graph, feeds)["y"]
    run(fuse_bias, graph)
    run(fuse_post_ops, graph)
    assert run(compose_post_ops, graph).changed == 1
    node = graph.node("conv")
    composed = node.meta["composed"]
    assert isinstance(composed, Composed)
    assert composed.post_ops == [Eltwise("relu")] and composed.bias is not None
    assert composed.dst_scale == pytest.approx(0.02) and composed.dst_zero_point == 0
    opts = node.meta["optimizations"]
    assert len(opts) == len(set(opts))
    assert {"mul_to_weight_scales", "add_to_bias", "drop_round_clip", "dst_scale"} <= set(opts)
    max_lsb, identical = step_diff(before, reference_composed(graph, feeds)["y"])
    assert max_lsb <= 1 and identical >= 0.999


def test_residual_block_maps_to_one_sum() -> None:
    graph = residual_block()
    feeds = feeds_for(graph)
    before = reference(graph, feeds)["y"]
    run(fuse_post_ops, graph)
    run(compose_post_ops, graph)
    composed = graph.node("conv").meta["composed"]
    assert sum(isinstance(p, Sum) for p in composed.post_ops) == 1
    assert any(isinstance(p, Eltwise) and p.alg == "round" for p in composed.post_ops)
    max_lsb, identical = step_diff(before, reference_composed(graph, feeds)["y"])
    assert max_lsb <= 1 and identical >= 0.999


def test_options_come_from_the_context() -> None:
    graph = residual_block()
    run(fuse_post_ops, graph)
    ctx = PassContext(composer=ComposerOptions().with_("drop_inner_round"))
    run(compose_post_ops, graph, ctx)
    node = graph.node("conv")
    assert "drop_inner_round" in node.meta["optimizations"]
    assert not any(isinstance(p, Eltwise) and p.alg == "round"
                   for p in node.meta["composed"].post_ops)


def test_pools_and_float_matmuls_are_composed_too() -> None:
    graph = new_graph()
    pool = add(graph, Op.GLOBAL_AVG_POOL, ["x"], "gap")
    pool.fused = Fused(chain=[Scale.of(0.05)], src_zero_point=3)
    graph.outputs.append("gap")
    assert run(compose_post_ops, graph).changed == 1
    assert graph.node("gap").meta["composed"].channels == 4


def test_a_chain_the_composer_refuses_is_a_bug() -> None:
    graph = new_graph()
    conv = int8_conv(graph)
    conv.fused.chain += [Residual(2), Shift.of(1.0), Residual(3)]  # two sums
    graph.outputs.append("conv")
    with pytest.raises(PassError, match="compose_post_ops.*'conv'.*one sum"):
        run(compose_post_ops, graph)
