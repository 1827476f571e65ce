"""Errors that the CLI turns into one `error:` line and an exit code (GUIDE.md section 8)."""

import re


class InfcError(Exception):
    exit_code = 1


class BadInput(InfcError):
    """The user gave us something we cannot use: exit code 2, message names the file."""

    exit_code = 2


class WrongTarget(InfcError):
    """A plan built for another machine: exit code 3."""

    exit_code = 3


# onnxruntime prefixes a failing check with the C++ file, line and function that made it
# ("/onnxruntime_src/.../reshape_helper.h:91 onnxruntime::ReshapeHelper::ReshapeHelper(const ...&, bool) "):
# in a one-line error that prefix used up the room and cut off the shapes that explain the failure
_ORT_SOURCE_LOCATION = re.compile(r"/onnxruntime_src/\S+:\d+ (?:[\w:~<>]+\([^()]*\) )?")


def error_reason(exc: BaseException, limit: int = 300) -> str:
    """An exception's first line for a one-line `error:`, without onnxruntime's source location."""
    first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return _ORT_SOURCE_LOCATION.sub("", first_line)[:limit]
