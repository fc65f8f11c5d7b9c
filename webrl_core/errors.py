"""The errors webrl explains. Each message names the file, the field or the value and what is expected; the CLI
(``webrl_cli.main``) prints one as ``webrl: error: <message>`` without a traceback and exits with its code:

* ``BadInput``: exit code 2, the input is wrong (a value, a field, a broken file, an unknown name);
* ``MissingInput``: exit code 1, a file or folder the command needs does not exist;
* ``WebrlError``: exit code 1, any other failure whose message says what happened and what to do.

Each area's own errors (``ConfigError``, ``TaskFileError``, ``StoreError``, ``ModelFolderError``, ...) derive from
these, so a command never formats or maps an error itself.
"""

from __future__ import annotations


class WebrlError(Exception):
    """A failure webrl explains in its message (exit code 1)."""

    exit_code = 1


class BadInput(WebrlError, ValueError):
    """Wrong input: a value, a field, a broken file, an unknown name (exit code 2)."""

    exit_code = 2


class MissingInput(WebrlError, FileNotFoundError):
    """A file or folder that the command needs does not exist (exit code 1). Also a ``FileNotFoundError``."""

    exit_code = 1

    def __str__(self) -> str:  # the message as given, not OSError's "[Errno ...]" form
        return str(self.args[0]) if self.args else ""


def exit_code(e: BaseException) -> int | None:
    """The exit code of an error webrl explains; None for any other error. A missing file wins over bad input, so
    ``class ConfigFileMissing(ConfigError, MissingInput)`` exits 1 although ``ConfigError`` is bad input."""
    if isinstance(e, MissingInput):
        return MissingInput.exit_code
    if isinstance(e, WebrlError):
        return e.exit_code
    return None
