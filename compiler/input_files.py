"""Input files the CLI reads: an .npz keyed by graph input name, or one .npy for a model with a
single graph input. Arrays are used as they are (no casts; the model checks shapes and dtypes).
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import onnx

from qfuse.compiler.errors import InputError
from qfuse.compiler.files import regular_file
from qfuse.compiler.onnx_import.context import symbolic_dims

__all__ = ["graph_input_names", "read_inputs"]


def graph_input_names(model: Path) -> list[str]:
    """The model's graph inputs that are not initializers, in order (no external data read)."""
    return list(_graph_inputs(model))


def shapes_of(model: Path, feeds: dict[str, np.ndarray]) -> dict[str, tuple[int, ...]] | None:
    """The feeds' shapes as ``input_shapes`` when the model leaves some input dim symbolic
    (a user's --inputs then fixes them, as --input-shape would); None when every dim is
    fixed (the model's own shapes apply, and a mismatch is the feeds' error)."""
    inputs = _graph_inputs(model)
    if all(symbolic_dims(t) == () for t in inputs.values()):
        return None
    return {name: tuple(np.shape(feeds[name])) for name in inputs if name in feeds}


def _graph_inputs(model: Path) -> dict[str, onnx.TypeProto.Tensor]:
    proto = onnx.load(str(model), load_external_data=False)
    initializers = {i.name for i in proto.graph.initializer}
    return {v.name: v.type.tensor_type for v in proto.graph.input if v.name not in initializers}


def read_inputs(path: Path, names: list[str]) -> dict[str, np.ndarray]:
    """``{input name: array}`` from ``path`` for a model whose graph inputs are ``names``.

    An .npz must hold every name (other arrays in it are ignored); an .npy is the one input of
    a single-input model. Anything else is an InputError naming the file."""
    path = regular_file(path, "inputs")
    if path.suffix == ".npy":
        if len(names) != 1:
            raise InputError(f"{path}: one .npy feeds a single-input model; this one has "
                             f"{len(names)} inputs {names} (use an .npz keyed by input name)")
        try:
            return {names[0]: np.load(path, allow_pickle=False)}
        except (OSError, ValueError, EOFError) as exc:
            raise InputError(f"{path}: not a numpy .npy array ({exc})") from exc
    try:
        with np.load(path, allow_pickle=False) as npz:
            feeds = {name: npz[name] for name in npz.files if name in names}
            held = list(npz.files)
    except (OSError, ValueError, AttributeError, TypeError, EOFError,
            zipfile.BadZipFile) as exc:
        raise InputError(f"{path}: not an .npz of arrays keyed by input name "
                         f"({type(exc).__name__}: {exc})") from exc
    missing = [n for n in names if n not in feeds]
    if missing:
        raise InputError(f"{path} lacks model inputs {missing} (it holds {held})")
    return feeds
