"""The library's own error types.

Every error the library raises on purpose is a `CebmError` whose message is one line
naming the file or option, the problem and the valid choices. The subclasses also derive from
the built-in type a caller would expect (``ValueError``, ``FileNotFoundError``, ``RuntimeError``),
so ``except ValueError`` keeps working. The command line prints the message and exits with
`CebmError.exit_code`: 2 for bad usage or bad input, 1 for a failure at run time.
"""

from __future__ import annotations


class CebmError(Exception):
    """Base class: a one-line message; ``exit_code`` 2 (bad usage or bad input)."""

    exit_code = 2


class InvalidInputError(CebmError, ValueError):
    """A bad value: an argument, a config or recipe setting, an expression."""


class ModelFileError(CebmError, ValueError):
    """A model folder, checkpoint or log that cannot be read as what it claims to be."""


class ModelNotFoundError(CebmError, FileNotFoundError):
    """A model name that is neither a folder, a bundled model nor a reachable (or cached) Hub repository."""


class NonFiniteError(CebmError, FloatingPointError):
    """Non-finite weights, energies or samples."""


class RunFailure(CebmError, RuntimeError):
    """A failure at run time, not caused by the input (a diverged run, a failed download); ``exit_code`` 1."""

    exit_code = 1


class HubUnavailableError(RunFailure):
    """The Hub did not answer in time, or refused the request."""


class FolderLockedError(CebmError, RuntimeError):
    """Another live process holds a run folder."""


def a_type(obj: object) -> str:
    """The type of ``obj`` with its indefinite article, for messages: "an AttributeClassifier", "a ResNetEnergy"."""
    noun = type(obj).__name__
    return f"{'an' if noun[:1] in 'AEIOU' else 'a'} {noun}"
