"""Random damage to real models: the importer either imports them or raises one of its two
errors, never a bare KeyError / IndexError / AttributeError."""

from __future__ import annotations

import logging
import random

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from qfuse.compiler.errors import MalformedModelError, UnsupportedModelError
from qfuse.compiler.onnx_import import import_model

zoo = pytest.importorskip("qfuse.examples.zoo")

INTS = [-3, -1, 0, 1, 2, 7, 1000]


def damage(m: onnx.ModelProto, rng: random.Random) -> onnx.ModelProto:
    """One random change: an attribute value, a dropped attribute or input, an initializer's
    values or size, an extra attribute, or an input dim."""
    m = onnx.ModelProto.FromString(m.SerializeToString())
    g = m.graph
    node = rng.choice(g.node)
    kind = rng.randrange(7)
    if kind == 0 and node.attribute:
        a = rng.choice(node.attribute)
        if a.type == onnx.AttributeProto.INTS and a.ints:
            a.ints[rng.randrange(len(a.ints))] = rng.choice(INTS)
        elif a.type == onnx.AttributeProto.INT:
            a.i = rng.choice(INTS)
        elif a.type == onnx.AttributeProto.FLOAT:
            a.f = rng.choice([0.0, -1.0, float("nan"), 1e30])
        elif a.type == onnx.AttributeProto.STRING:
            a.s = rng.choice([b"", b"SAME_UPPER", b"nearest", b"xyz", b"VALID"])
    elif kind == 1 and node.attribute:
        node.attribute.remove(rng.choice(node.attribute))
    elif kind in (2, 3) and g.initializer:
        t = rng.choice(g.initializer)
        flat = numpy_helper.to_array(t).reshape(-1).copy()
        if kind == 3:
            flat = flat[: max(1, flat.size // 2)]
        elif flat.size:
            bad = [0.0, -1.0, np.nan, np.inf] if flat.dtype.kind == "f" else [0, 1, 5, 100]
            flat[rng.randrange(flat.size)] = rng.choice(bad)
        t.CopyFrom(numpy_helper.from_array(flat, t.name))
    elif kind == 4 and len(node.input) > 1:
        del node.input[-1]
    elif kind == 5:
        name = rng.choice(["axis", "group", "auto_pad", "ceil_mode", "allowzero", "perm"])
        node.attribute.append(helper.make_attribute(name, rng.choice(INTS)))
    elif kind == 6 and g.input and g.input[0].type.tensor_type.shape.dim:
        dims = g.input[0].type.tensor_type.shape.dim
        dims[rng.randrange(len(dims))].dim_value = rng.choice([1, 2, 3, 0, 97])
    return m


@pytest.mark.parametrize("name", ["mobilenetv2", "unet", "transformer"])
@pytest.mark.parametrize("quantized", [False, True], ids=["float", "qdq"])
def test_damaged_models_raise_only_import_errors(name: str, quantized: bool,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    base = zoo.quantized_model(name) if quantized else zoo.float_model(name)
    rng = random.Random(f"{name}-{quantized}")
    outcomes = {"imported": 0, "refused": 0}
    for _ in range(40):
        try:
            import_model(damage(base, rng))
            outcomes["imported"] += 1
        except (MalformedModelError, UnsupportedModelError) as exc:
            assert str(exc).strip(), "an error without a message"
            outcomes["refused"] += 1
    assert outcomes["refused"] > 0
