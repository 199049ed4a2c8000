"""Errors that mean "the request was wrong", which the CLI prints as one line (exit status 2).
Anything else is a bug in labkit and keeps its traceback."""


class UsageError(ValueError):
    """A request labkit refuses, with a message naming the argument and what was expected."""
