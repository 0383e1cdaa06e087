"""`scaffold new`: render a project and write it atomically."""

from __future__ import annotations

from pathlib import Path

from scaffold.answers import Answers
from scaffold.errors import ScaffoldError
from scaffold.render import render
from scaffold.write import check_destination, recover, write_new_project


def new_project(dest: Path, answers: Answers, force: bool = False) -> dict[str, bytes]:
    dest = Path(dest)
    answers = answers.validated()
    if dest.is_dir() and not dest.is_symlink():
        recover(dest)  # an interrupted `new --force` into it: finish or undo it first
    # Refuse before rendering: a bad destination should not cost a render.
    check_destination(dest, force)
    files = render(answers)
    try:
        write_new_project(dest, files, force=force)
    except OSError as exc:
        raise ScaffoldError(
            f"cannot write {dest} ({exc.strerror or exc}): check the path and its permissions"
        ) from None
    return files
