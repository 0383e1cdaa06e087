"""The one error hierarchy: the CLI prints these as a single line and exits with `code`."""


class ScaffoldError(Exception):
    """A problem the user can fix; the message says how. Exit status 1."""

    code = 1


class UsageError(ScaffoldError):
    """The command line itself is wrong (unknown feature or task, bad name). Exit status 2."""

    code = 2
