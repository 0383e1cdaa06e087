"""`scaffold new`: render a project and write it atomically."""

from __future__ import annotations

from pathlib import Path

from scaffold.render import Answers, render, write_new_project


def new_project(dest: Path, answers: Answers, force: bool = False) -> dict[str, bytes]:
    dest = Path(dest)
    answers = answers.validated()
    # Refuse before rendering: a bad destination should not cost a render.
    from scaffold.errors import ScaffoldError

    if dest.exists() and dest.is_dir() and any(dest.iterdir()) and not force:
        raise ScaffoldError(
            f"{dest} exists and is not empty: choose another path, or pass --force "
            "to write the generated files into it"
        )
    files = render(answers)
    write_new_project(dest, files, force=force)
    return files
