"""layouts.canonical: a view's size-1 dims get the strides oneDNN's tags give them, so a
primitive reading a Reshape view of a channels-last tensor finds its jit implementation."""

from __future__ import annotations

import pytest

from qfuse.compiler.lower.layouts import canonical, same_bytes
from qfuse.runtime.onednn import Alg, DataType, MemoryDesc, binary


@pytest.mark.parametrize("dims,strides,want", [
    ((1, 82, 400), (82, 1, 82), (32800, 1, 82)),  # Reshape of a (1, 82, 20, 20) nhwc tensor
    ((1, 16, 1, 8), (16, 1, 99, 16), (128, 1, 128, 16)),  # nhwc, H = 1
    ((1, 6, 5), (1, 5, 1), (30, 5, 1)),  # row-major, N stride 1
])
def test_same_bytes_get_a_tag_s_strides(dims: tuple, strides: tuple, want: tuple) -> None:
    md = MemoryDesc.from_strides(dims, DataType.u8, strides)
    got = canonical(md)
    assert got.strides == want
    assert same_bytes(md, got)


@pytest.mark.parametrize("dims,strides", [
    ((1, 82, 400), (32800, 1, 82)),  # already nwc
    ((2, 3, 4), (1, 2, 6)),  # no size-1 dim
    ((1, 16, 8, 8), (2048, 1, 256, 32)),  # a channel slice: not dense, kept
])
def test_other_layouts_are_kept(dims: tuple, strides: tuple) -> None:
    md = MemoryDesc.from_strides(dims, DataType.u8, strides)
    assert canonical(md) is md


def test_binary_on_the_canonical_view_is_not_reference() -> None:
    odd = MemoryDesc.from_strides((1, 82, 400), DataType.f32, (82, 1, 82))
    nwc = MemoryDesc.from_strides((1, 82, 400), DataType.f32, (32800, 1, 82))
    one = MemoryDesc.from_strides((1, 1, 1), DataType.f32, (1, 1, 1))
    assert "ref" in binary(Alg.binary_add, odd, one, nwc).impl_name  # why canonical exists
    assert "ref" not in binary(Alg.binary_add, canonical(odd), one, nwc).impl_name
