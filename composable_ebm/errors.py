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


MAX_LINE = 600
"""Longest error line the command line and the studio show."""

LONG_WORD = 80
"""A word longer than this (a pasted name, a long path) is shortened in the middle before a line is cut."""


def one_line(err: BaseException) -> str:
    """An error's message on one line of at most `MAX_LINE` characters: a longer one has its words of more than
    `LONG_WORD` characters (pasted names, long paths) shortened in the middle first, so the sentence itself is kept;
    only then is its end cut."""
    text = " ".join(str(err).split()) or type(err).__name__
    if isinstance(err, KeyError):
        text = f"missing key {text}"
    words = text.split(" ")
    for i in sorted(range(len(words)), key=lambda k: -len(words[k])):
        if len(text) <= MAX_LINE or len(words[i]) <= LONG_WORD:
            break
        keep = max(LONG_WORD - 20, len(words[i]) - (len(text) - MAX_LINE) - 1)
        words[i] = words[i][:keep // 2] + "\u2026" + words[i][len(words[i]) - (keep - keep // 2):]
        text = " ".join(words)
    return text if len(text) <= MAX_LINE else text[:MAX_LINE - 3] + "..."


def quote(text: str, limit: int = 120) -> str:
    """Text from the user (an expression) as an error quotes it: whole when short, else its start and end and its
    length, so the message's own words (what was expected, where) survive a one-line report."""
    return repr(text) if len(text) <= limit else f"{text[:limit // 2]!r} ... {text[-limit // 2:]!r} ({len(text):,} characters)"


def utf8_text(text: str) -> str:
    """``text`` as UTF-8 can hold it: a lone surrogate (how Python keeps the bytes of a path that is not UTF-8, such
    as a recipe's name or a folder) becomes U+FFFD, so a card or a plot's title that names one never fails to
    encode."""
    import re

    return re.sub("[\ud800-\udfff]", "\ufffd", text)
