"""Errors the trainer reports to a user as one line, with exit code 2."""

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
