"""Reading a model: protobuf, external data (only from inside the model's folder), opset
checks and onnx.checker.

External data is read by hand rather than by onnx.load: each tensor's location is resolved
(symlinks included) and must stay inside the folder of the model file; ``..``, absolute
locations and symlinks leading out are refused with MalformedModelError naming the tensor.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto

from qfuse.compiler.errors import MalformedModelError, UnsupportedModelError
from qfuse.compiler.onnx_import.context import DEFAULT_DOMAINS, OPENVINO_DOMAIN

logger = logging.getLogger(__name__)

MIN_OPSET, MAX_OPSET = 11, 21


def load(model: onnx.ModelProto | str | os.PathLike) -> onnx.ModelProto:
    """A private copy of the model with all tensor data inline, checked."""
    if isinstance(model, onnx.ModelProto):
        proto = onnx.ModelProto()
        proto.CopyFrom(model)
        base: Path | None = None
    elif isinstance(model, (str, os.PathLike)):
        path = Path(model)
        try:
            proto = onnx.load(str(path), load_external_data=False)
        except (DecodeError, RuntimeError) as exc:
            raise MalformedModelError(f"'{path}' is not an ONNX model: {exc}") from exc
        base = path.resolve().parent
    else:
        raise TypeError(f"import_model takes a ModelProto or a path, not {type(model).__name__}")
    for tensor in _tensors(proto.graph):
        if tensor.data_location == TensorProto.EXTERNAL:
            _load_external(tensor, base)
    opset = default_opset(proto)
    _check(proto)
    logger.debug("loaded model '%s' (opset %d, %d nodes)", proto.graph.name, opset,
                 len(proto.graph.node))
    return proto


def default_opset(proto: onnx.ModelProto) -> int:
    """The default domain's opset, checked against the supported range."""
    versions = {o.domain: o.version for o in proto.opset_import}
    opset = next((versions[d] for d in DEFAULT_DOMAINS if d in versions), None)
    if opset is None:
        raise MalformedModelError("the model imports no opset of the default ONNX domain")
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise UnsupportedModelError(
            f"opset {opset} of the default ONNX domain is not supported "
            f"(supported: {MIN_OPSET} to {MAX_OPSET}); convert the model with "
            f"onnx.version_converter"
        )
    for domain in versions:
        if domain not in (*DEFAULT_DOMAINS, OPENVINO_DOMAIN):
            logger.debug("model imports domain '%s'; its nodes will be refused", domain)
    return opset


def _check(proto: onnx.ModelProto) -> None:
    try:
        onnx.checker.check_model(proto, full_check=False)
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
        raise MalformedModelError(f"onnx.checker rejects the model: {first}") from exc
    except ValueError as exc:
        if "2GB" not in str(exc):
            raise MalformedModelError(f"onnx.checker rejects the model: {exc}") from exc
        logger.warning("model is larger than 2 GB; onnx.checker skipped")


def _tensors(graph: onnx.GraphProto) -> Iterator[TensorProto]:
    """Every tensor in the graph, subgraphs included."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("sparse_tensor"):
                yield attr.sparse_tensor.values
                yield attr.sparse_tensor.indices
            if attr.HasField("g"):
                yield from _tensors(attr.g)
            for sub in attr.graphs:
                yield from _tensors(sub)


def _load_external(tensor: TensorProto, base: Path | None) -> None:
    name = tensor.name or "<unnamed>"
    if base is None:
        raise MalformedModelError(
            f"tensor '{name}' keeps its data in an external file; import the model from its "
            f"path so the file can be found"
        )
    entries = {e.key: e.value for e in tensor.external_data}
    location = entries.get("location")
    if not location:
        raise MalformedModelError(f"tensor '{name}': external data without a location")
    target = (base / location).resolve()
    if Path(location).is_absolute() or not target.is_relative_to(base):
        raise MalformedModelError(
            f"tensor '{name}': external data location '{location}' is outside the model's "
            f"folder '{base}'"
        )
    try:
        offset = int(entries.get("offset", 0))
        length = int(entries["length"]) if "length" in entries else None
    except ValueError as exc:
        raise MalformedModelError(f"tensor '{name}': bad external data offset/length") from exc
    try:
        with open(target, "rb") as f:
            f.seek(offset)
            data = f.read() if length is None else f.read(length)
    except OSError as exc:
        raise MalformedModelError(
            f"tensor '{name}': cannot read external data '{location}': {exc}"
        ) from exc
    if length is not None and len(data) != length:
        raise MalformedModelError(
            f"tensor '{name}': external data '{location}' has {len(data)} bytes at offset "
            f"{offset}, want {length}"
        )
    tensor.raw_data = data
    del tensor.external_data[:]
    tensor.data_location = TensorProto.DEFAULT
