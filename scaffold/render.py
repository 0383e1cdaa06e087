"""Render the copier template into memory and format it with black: answers in, files out.

Plain functions a test can call; nothing here writes into a project (see `scaffold.write`).
copier, black and jinja2 are imported inside the functions that need them, so `scaffold --help`
stays fast.
"""

from __future__ import annotations

import functools
import hashlib
import re
import tempfile
from importlib.metadata import version
from pathlib import Path

from scaffold import __version__, cache, catalogue, layers
from scaffold.answers import Answers
from scaffold.catalogue import requirements
from scaffold.errors import ScaffoldError
from scaffold.record import Record, make_record
from scaffold.versions import TEMPLATE_VERSION, version_of


def template_dir() -> Path:
    """The copier template: inside the installed package, or `templates/` of a source checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "templates", here.parent / "templates"):
        if (candidate / "copier.yml").is_file():
            return candidate
    raise ScaffoldError(
        "the scaffold template is missing from this installation: reinstall scaffold"
    )


@functools.cache
def template_fingerprint(templates: Path | None = None) -> str:
    """A hash of every template file, so a project records which template rendered it.

    `templates`: another template folder (an older version's, for `scaffold upgrade`'s tests)."""
    digest = hashlib.sha256()
    root = Path(templates) if templates is not None else template_dir()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        if "__pycache__" in path.parts:
            continue
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


@functools.cache
def black_version() -> str:
    return version("black")


def base_is_current(record: Record) -> bool:
    """True if the installed templates and black made the record's pristine copy, so it is the
    render of the recorded answers (no need to render them again)."""
    if not record.is_from(template_fingerprint(), black_version()):
        return False
    recorded = [pin.identity for pin in record.answers.layers]
    return recorded == [layer.identity for layer in record.answers.loaded_layers()]


def render(answers: Answers, templates: Path | None = None) -> dict[str, bytes]:
    """Render the template for `answers` and return {relative posix path: bytes}, black-formatted.

    The result includes the project's record (`.scaffold/record.json`) and pristine copy.
    `templates`: another template folder than the installed one (an older version's, in tests).
    """
    answers = answers.validated()
    loaded = answers.loaded_layers()
    with tempfile.TemporaryDirectory(prefix="scaffold-render-") as tmp:
        _run_copier(Path(tmp), answers, templates)
        files = _collect(Path(tmp))
    # the extension points: each layer's blocks, files and defaults (or nothing, without layers)
    files = layers.apply(files, loaded, {**answers.as_data(), "layers": [x.name for x in loaded]})
    files = {path: format_file(path, data) for path, data in files.items()}
    _check_no_template_syntax(files)
    fingerprint = template_fingerprint(templates)
    files.update(
        make_record(
            answers,
            files,
            template=fingerprint,
            black_version=black_version(),
            # the installed templates are TEMPLATE_VERSION (a test keeps the history in step);
            # another folder's is looked up in the history (None: never shipped)
            template_version=TEMPLATE_VERSION if templates is None else version_of(fingerprint),
        )
    )
    return files


def _run_copier(dst: Path, answers: Answers, templates: Path | None = None) -> None:
    import copier

    try:
        with cache.jinja_code_cache():
            copier.run_copy(
                str(templates if templates is not None else template_dir()),
                str(dst),
                data={
                    "project_name": answers.project_name,
                    "task": answers.task,
                    "description": answers.description,
                    # the template knows scaffold's features; a layer's come in at the points
                    "features": [name for name in answers.features if name in catalogue.FEATURES],
                    "scaffold_version": __version__,
                    "requirements": requirements(
                        answers.task, answers.features, answers.catalogue()
                    ),
                },
                defaults=True,
                overwrite=True,
                quiet=True,
                unsafe=False,
                skip_tasks=True,
            )
    except Exception as exc:  # copier raises many types; present them as one line
        raise ScaffoldError(f"rendering the template failed: {exc}") from exc


def _collect(root: Path) -> dict[str, bytes]:
    files = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            files[path.relative_to(root).as_posix()] = path.read_bytes()
    return files


def format_file(path: str, data: bytes) -> bytes:
    """black's output for a `.py` file (through the black cache); other files unchanged."""
    if not path.endswith(".py"):
        return data
    entry = cache.key(black_version().encode(), data) + ".py"
    formatted = cache.load("black", entry)
    if formatted is not None:
        return formatted
    import black

    try:
        formatted = black.format_str(data.decode(), mode=black.Mode()).encode()
    except black.InvalidInput as exc:  # a template bug, never the user's
        raise ScaffoldError(f"generated {path} is not valid Python: {exc}") from exc
    cache.store("black", entry, formatted)
    return formatted


_TEMPLATE_SYNTAX = re.compile(rb"\{\{|\}\}|\{%|%\}|\{#|#\}")


def _check_no_template_syntax(files: dict[str, bytes]) -> None:
    for path, data in files.items():
        if _TEMPLATE_SYNTAX.search(data):
            raise ScaffoldError(f"template syntax survived into {path}: report this bug")
