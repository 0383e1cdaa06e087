"""Where scaffold keeps its own files inside a project, and which file names it may touch."""

from __future__ import annotations

from pathlib import Path

from scaffold.errors import ScaffoldError

RECORD_DIR = ".scaffold"


def in_record_dir(rel: str) -> bool:
    """True for scaffold's own files (`.scaffold/...`), False for the project's files."""
    return rel.startswith(RECORD_DIR + "/")


def check_relpath(rel: str) -> str:
    """A file name scaffold may write or delete: relative, '/'-separated, inside the project."""
    if (
        not isinstance(rel, str)
        or not rel
        or rel.startswith("/")
        or "\\" in rel
        or not rel.isprintable()
        or any(part in ("", ".", "..") for part in rel.split("/"))
    ):
        raise ScaffoldError(
            f"refusing to write {rel!r}: not a relative path inside the project (report this bug)"
        )
    return rel


def template_dir() -> Path:
    """The templates: inside the installed package, or `templates/` of a source checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "templates", here.parent / "templates"):
        if (candidate / "copier.yml").is_file():
            return candidate
    raise ScaffoldError(
        "the scaffold template is missing from this installation: reinstall scaffold"
    )
