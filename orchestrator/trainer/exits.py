"""Errors the trainer reports to a user as one line: exit code 2 for bad input, 1 otherwise."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports it


class TrainerUsageError(Exception):
    """Bad input a user can fix: an option value, a missing file, a corrupt checkpoint.

    ``str()`` is the whole message: what is wrong (naming the option and value) and
    what to do. The CLI prints it on one line and exits 2.
    """


class CheckpointError(TrainerUsageError):
    """A checkpoint that cannot be read or does not fit this run."""


class TrainerRuntimeError(Exception):
    """A foreseeable failure that is not the user's input: a peer rank that never came.

    ``str()`` is the whole message, like TrainerUsageError's, but the CLI exits 1: the
    same command may well work on a second try.
    """
