"""Errors a user can act on: the model, its inputs or the command line are the problem.

Every message names the node and op it is about (``node 'conv3' (ConvTranspose): ...``) or the
tensor / opset / input / argument involved. The CLI reports these in one line with exit code 1;
any other exception is a bug of qfuse's (exit code 3, ``internal error``). They subclass
ValueError too, so ``except ValueError`` written before this split still catches them.
"""

from __future__ import annotations


class QfuseError(Exception):
    """Base class of the errors that are the user's to fix."""


class UnsupportedModelError(QfuseError, ValueError):
    """A valid model that uses something qfuse does not implement (op, type, attribute)."""


class MalformedModelError(QfuseError, ValueError):
    """A model that breaks the ONNX spec or is inconsistent (checker failure, bad shapes,
    invalid quantization parameters, external data outside the model's folder)."""


class SizeLimitError(UnsupportedModelError):
    """A tensor or model larger than the configured limits (ir/limits.py), refused from the
    declared shapes before anything is allocated."""


class InputError(QfuseError, ValueError):
    """Inputs or arguments that do not fit the model or the command (missing or unknown feeds,
    wrong dtype or shape, an unknown mode or engine)."""


__all__ = ["InputError", "MalformedModelError", "QfuseError", "SizeLimitError",
           "UnsupportedModelError"]
