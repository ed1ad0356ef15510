"""Reading and writing the user's files: one InputError naming the file for anything wrong.

Models, inputs and calibration data are read only from regular files (a FIFO or a device
would block or never end); .npz files are read without pickles; outputs are written to
exactly the path given (numpy's ``savez`` would append ``.npz`` to a name without it).
"""

from __future__ import annotations

import os
import stat
import zipfile
from pathlib import Path

import numpy as np

from qfuse.compiler.errors import InputError


def regular_file(path: str | os.PathLike, what: str) -> Path:
    """``path`` if it names an existing regular file (symlinks followed), else InputError."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read {what} '{path}': {_reason(exc)}") from exc
    if stat.S_ISDIR(mode):
        raise InputError(f"{what} '{path}' is a directory, not a file")
    if not stat.S_ISREG(mode):
        raise InputError(f"{what} '{path}' is not a regular file (a FIFO, socket or device)")
    return path


def load_npz(path: str | os.PathLike, what: str = "inputs") -> dict[str, np.ndarray]:
    """The arrays of an .npz file keyed by name."""
    path = regular_file(path, what)
    try:
        loaded = np.load(path, allow_pickle=False)
    except OSError as exc:
        raise InputError(f"cannot read {what} '{path}': {_reason(exc)}") from exc
    except (ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise InputError(f"{what} '{path}' is not an .npz file ({_reason(exc)})") from exc
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise InputError(f"{what} '{path}' holds a single .npy array; give an .npz keyed by "
                         f"input name (np.savez(path, **{{name: array}}))")
    with loaded:
        try:
            return {name: loaded[name] for name in loaded.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
            raise InputError(f"{what} '{path}': an array cannot be read ({_reason(exc)})") \
                from exc


def save_npz(path: str | os.PathLike, arrays: dict[str, np.ndarray], what: str = "outputs"
             ) -> None:
    """Write ``arrays`` to exactly ``path`` as an .npz."""
    path = writable(path, what)
    try:
        with open(path, "wb") as f:
            np.savez(f, **arrays)
    except OSError as exc:
        raise InputError(f"cannot write {what} '{path}': {_reason(exc)}") from exc


def write_text(path: str | os.PathLike, text: str, what: str) -> None:
    path = writable(path, what)
    try:
        path.write_text(text)
    except OSError as exc:
        raise InputError(f"cannot write {what} '{path}': {_reason(exc)}") from exc


def writable(path: str | os.PathLike, what: str) -> Path:
    """``path`` if a file can be created there: not a directory, in an existing folder (checked
    before long work, so that it does not fail at the end)."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"cannot write {what} '{path}': it is a directory")
    if not path.absolute().parent.is_dir():
        raise InputError(f"cannot write {what} '{path}': its folder does not exist")
    return path


def _reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


__all__ = ["load_npz", "regular_file", "save_npz", "writable", "write_text"]
