"""The library's own error types.

Every error the library raises on purpose is a `CebmError` whose message is one line
naming the file or option, the problem and the valid choices. The subclasses also derive from
the built-in type a caller would expect (``ValueError``, ``FileNotFoundError``, ``RuntimeError``),
so ``except ValueError`` keeps working. The command line prints the message and exits with
`CebmError.exit_code`: 2 for bad usage or bad input, 1 for a failure at run time.
`exit_code_for`, `one_line` and `bug_line` are how the command line and the studio word any error:
the user's to mend, or a bug of ours.
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


class DataNotFoundError(CebmError, FileNotFoundError):
    """A data folder, table or file a dataset names that is not there."""


class NonFiniteError(CebmError, FloatingPointError):
    """Non-finite weights, energies or samples."""


class RunFailure(CebmError, RuntimeError):
    """A failure at run time, not caused by the input (a diverged run, a failed download); ``exit_code`` 1."""

    exit_code = 1


class HubUnavailableError(RunFailure):
    """The Hub did not answer in time, or refused the request."""


class FolderLockedError(CebmError, RuntimeError):
    """Another live process holds a run folder, or its lock file is damaged."""


class NotSavableError(CebmError, AttributeError):
    """A save or push asked of an object that is not a trained model (an algebra node); an ``AttributeError`` too,
    as ``hasattr`` expects."""


def a_type(obj: object) -> str:
    """The type of ``obj`` with its indefinite article, for messages: "an AttributeClassifier", "a ResNetEnergy"."""
    noun = type(obj).__name__
    return f"{'an' if noun[:1] in 'AEIOU' else 'a'} {noun}"


def exit_code_for(err: BaseException) -> int | None:
    """The exit status for an error reported as the user's to mend (the command line exits with it, the
    studio shows its message); ``None``: a bug.

    The library raises `CebmError` for what it expects; ``ValueError`` (a setting torch or a config
    refuses), ``SafetensorError``, ``OSError`` (a file) and ``ImportError`` (a recipe needing a package
    not installed) are bad input too. A ``TypeError``, ``KeyError``, ``AttributeError`` ... is a bug in
    the library, never the user's input: it is reported as one (`bug_line`).
    """
    from safetensors import SafetensorError

    if isinstance(err, CebmError):
        return err.exit_code
    if isinstance(err, (ValueError, SafetensorError, OSError, ImportError)):
        return 2  # bad input: configs, files, arguments, a recipe needing a package not installed
    if isinstance(err, RuntimeError):
        return 1  # a failure at run time (out of memory, a device error)
    return None


BUG_EXIT_CODE = 1


def bug_line(err: BaseException, advice: str = "rerun with --debug for the traceback and report it") -> str:
    """One line for an error the library did not expect: its type and message, named as a bug, and what to do."""
    return f"internal error ({type(err).__name__}: {one_line(err)}); this is a bug in composable_ebm, not your input: {advice}"


def one_line(err: BaseException) -> str:
    """An error's message on one line (at most 400 characters)."""
    text = " ".join(str(err).split()) or type(err).__name__
    if isinstance(err, KeyError):
        text = f"missing key {text}"
    return text if len(text) <= 400 else text[:397] + "..."
