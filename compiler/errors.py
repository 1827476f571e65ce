"""Errors that the CLI turns into one `error:` line and an exit code (GUIDE.md section 8)."""


class InfcError(Exception):
    exit_code = 1


class BadInput(InfcError):
    """The user gave us something we cannot use: exit code 2, message names the file."""

    exit_code = 2


class WrongTarget(InfcError):
    """A plan built for another machine: exit code 3."""

    exit_code = 3
