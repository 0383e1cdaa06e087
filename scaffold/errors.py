"""The one error hierarchy: the CLI prints these as a single line and exits with `code`.

Exit codes mean one thing each: 0 done, clean; 1 done, with conflicts to resolve (markers or listed
items: printed by the command, not raised); 2 refused, nothing written (every ScaffoldError).
"""


class ScaffoldError(Exception):
    """A problem the user can fix; the message says how. Exit status 2: nothing was written."""

    code = 2


class UsageError(ScaffoldError):
    """The command line itself is wrong (unknown feature or task, bad name). Exit status 2."""

    code = 2
