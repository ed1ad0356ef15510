"""Calibration data: where the float model's inputs come from.

Accepted forms (every array batched on its first axis, keyed by the model's input names):

- an ``.npz`` file with one array per input, ``N`` samples each;
- a folder of ``.npz`` files (each like the above) and/or ``.npy`` files (a model with one
  input only), read in sorted name order;
- in Python, also a mapping {input name: array} or a list of such mappings.

``batches(data, inputs, batch)`` yields feed dicts of at most ``batch`` samples (the model's
fixed batch size, or any size when the first dimension is symbolic).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from qfuse.compiler.errors import InputError
from qfuse.compiler.files import load_npz, regular_file

CalibrationData = str | os.PathLike | Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]]


def load(data: CalibrationData, inputs: Sequence[str]) -> list[dict[str, np.ndarray]]:
    """The calibration data as a list of {input: batched array} chunks (one per file)."""
    if isinstance(data, Mapping):
        chunks = [dict(data)]
    elif isinstance(data, (str, os.PathLike)):
        chunks = _from_path(Path(data), inputs)
    else:
        chunks = [dict(d) for d in data]
    if not chunks:
        raise InputError(f"calibration data {data!r} holds no samples")
    for i, chunk in enumerate(chunks):
        missing = [n for n in inputs if n not in chunk]
        if missing:
            raise InputError(f"calibration data (part {i}) lacks model inputs {missing} "
                             f"(has {sorted(chunk)})")
        sizes = {n: np.asarray(chunk[n]).shape[0] if np.ndim(chunk[n]) else 0 for n in inputs}
        if len(set(sizes.values())) != 1 or 0 in sizes.values():
            raise InputError(f"calibration data (part {i}): inputs must share a non-empty "
                             f"first (batch) axis, got {sizes}")
    return [{n: np.asarray(c[n]) for n in inputs} for c in chunks]


def _from_path(path: Path, inputs: Sequence[str]) -> list[dict[str, np.ndarray]]:
    if not path.exists():
        raise InputError(f"calibration data {path} does not exist")
    files = sorted(p for p in path.iterdir() if p.suffix in (".npz", ".npy")) \
        if path.is_dir() else [path]
    if not files:
        raise InputError(f"calibration folder {path} has no .npz or .npy files")
    chunks = []
    for f in files:
        if f.suffix == ".npz" or not path.is_dir():
            chunks.append(load_npz(f, "calibration data"))
        elif f.suffix == ".npy":
            if len(inputs) != 1:
                raise InputError(f"{f}: a .npy file feeds a one-input model; this model has "
                                 f"inputs {list(inputs)} (use .npz keyed by input name)")
            chunks.append({inputs[0]: _load_npy(f)})
    return chunks


def _load_npy(path: Path) -> np.ndarray:
    regular_file(path, "calibration data")
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise InputError(f"calibration data '{path}' is not a readable .npy file ({exc})") \
            from exc


def batches(chunks: list[dict[str, np.ndarray]], batch: int | None
            ) -> Iterator[dict[str, np.ndarray]]:
    """Feeds of ``batch`` samples (None: each chunk whole); a short last batch is padded only
    when the model's batch is fixed — it is then dropped instead (never padded with fakes)."""
    for chunk in chunks:
        n = next(iter(chunk.values())).shape[0]
        step = batch or n
        for i in range(0, n, step):
            part = {k: v[i:i + step] for k, v in chunk.items()}
            if batch and next(iter(part.values())).shape[0] != batch:
                continue
            yield part


def count(chunks: list[dict[str, np.ndarray]], batch: int | None) -> int:
    total = 0
    for chunk in chunks:
        n = next(iter(chunk.values())).shape[0]
        total += n // batch if batch else 1
    return total
