"""The exit codes every ``clip-gateway`` command shares, and the help text that lists them."""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    OK = 0
    ERROR = 1  # something unexpected (serve: a child process failed); the message says what
    USAGE = 2  # a bad option or argument, a file that is not a library, a launch misconfigured
    INCOMPLETE = 3  # embed: some files could not be embedded (each is named)
    UNREACHABLE = 4  # the gateway could not be reached
    REFUSED = 5  # the gateway refused the request (API key, model, a server error)
    INTERRUPTED = 130  # Ctrl-C; embed keeps its last checkpoint


EXIT_CODES = (
    "\b\nExit codes:\n"
    "  0  done (embed: every readable photo is in the library)\n"
    "  1  unexpected error (CLIP_GATEWAY_DEBUG=1 shows the traceback); serve: a child failed\n"
    "  2  bad option or argument, or a LIBRARY that is not one; serve: a launch that cannot work\n"
    "  3  embed: some files could not be embedded; each is named and recorded\n"
    "  4  the gateway could not be reached\n"
    "  5  the gateway refused the request (API key, model, server error)\n"
    "  130  interrupted (embed resumes from its last checkpoint)"
)
