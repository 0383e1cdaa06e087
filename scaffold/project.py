"""`scaffold new`: render a project and write it atomically."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

from scaffold.answers import Answers
from scaffold.errors import ScaffoldError
from scaffold.lock import project_lock
from scaffold.render import project_files
from scaffold.write import check_destination, write_new_project


def new_project(
    dest: Path, answers: Answers, force: bool = False, wait: float | None = None
) -> dict[str, bytes]:
    dest = Path(dest)
    answers = answers.validated()
    # Into a folder that holds a scaffold project (--force): hold it, as `add` does, and finish or
    # undo an interrupted write into it first. A new folder needs no lock: it appears by a rename.
    locked = dest.is_dir() and not dest.is_symlink()
    with (
        project_lock(dest, write=True, command="new --force", wait=wait)
        if locked
        else nullcontext()
    ):
        # Refuse before rendering: a bad destination should not cost a render.
        check_destination(dest, force)
        files = project_files(answers)
        try:
            write_new_project(dest, files, force=force)
        except OSError as exc:
            raise ScaffoldError(
                f"cannot write {dest} ({exc.strerror or exc}): check the path and its permissions"
            ) from None
    return files
