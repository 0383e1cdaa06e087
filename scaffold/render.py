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
from pathlib import Path, PurePosixPath

from scaffold import __version__, blocks, cache, catalogue, layers
from scaffold.answers import Answers
from scaffold.catalogue import requirements
from scaffold.errors import ScaffoldError
from scaffold.imports import sort_imports
from scaffold.paths import template_dir
from scaffold.record import Record, make_record
from scaffold.versions import TEMPLATE_VERSION, canonical, version_of


def template_fingerprint(templates: Path | None = None) -> str:
    """What a project records of the templates that rendered it: the hash of every template file
    (`source_fingerprint`), or, for templates that render a version byte for byte (listed in the
    history's `same_output`), that version's fingerprint.

    `templates`: another template folder (an older version's, for `scaffold upgrade`'s tests)."""
    return canonical(source_fingerprint(templates))


@functools.cache
def source_fingerprint(templates: Path | None = None) -> str:
    """A hash of every template file."""
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
    """Render the template for `answers` and return the project's files, {relative posix path:
    bytes}, black-formatted; no record (`project_files` adds it).

    `templates`: another template folder than the installed one (an older version's, in tests).
    """
    answers = answers.validated()
    loaded = answers.loaded_layers()
    root = templates if templates is not None else template_dir()
    data = template_data(answers)
    with tempfile.TemporaryDirectory(prefix="scaffold-render-") as tmp:
        _run_copier(Path(tmp), root, data)
        files = _collect(Path(tmp))
    # scaffold's features' folders (features/NAME/: blocks at the points, files), then each
    # layer's blocks, files and defaults; a point without a block leaves nothing
    own_blocks, own_files = blocks.own(root, data["features"], data)
    files.update(own_files)
    context = {**answers.as_data(), "layers": [x.name for x in loaded]}
    files = layers.apply(files, loaded, context, own_blocks)
    # each .py file's imports where isort puts them (a feature's come from its folder)
    own_modules = {PurePosixPath(path).stem for path in files if path.endswith(".py")}
    files = {path: format_file(path, data, own_modules) for path, data in files.items()}
    _check_no_template_syntax(files)
    return files


def installed_templates(templates: Path | None = None) -> tuple[str, int | None]:
    """(fingerprint, version) of the installed templates, or of another folder's (its version
    looked up in the history; None: never shipped)."""
    fingerprint = template_fingerprint(templates)
    # the installed templates are TEMPLATE_VERSION (a test keeps the history in step)
    return fingerprint, TEMPLATE_VERSION if templates is None else version_of(fingerprint)


def record_of(
    answers: Answers, files: dict[str, bytes], target: tuple[str, int | None] | None = None
) -> dict[str, bytes]:
    """The record of `files`, the render of `answers`: `.scaffold/record.json` and the pristine
    copy. The one place a record is made (`scaffold new`, add/remove feature, upgrade).

    `target`: (fingerprint, version) of the templates that rendered them (`installed_templates`);
    None: the installed ones."""
    fingerprint, template_version = target if target is not None else installed_templates()
    return make_record(
        answers.validated(),  # as rendered: features in the catalogue's order
        files,
        template=fingerprint,
        black_version=black_version(),
        template_version=template_version,
    )


def project_files(answers: Answers, templates: Path | None = None) -> dict[str, bytes]:
    """What `scaffold new` writes: the render of `answers` and its record."""
    answers = answers.validated()
    files = render(answers, templates)
    return {**files, **record_of(answers, files, installed_templates(templates))}


def template_data(answers: Answers) -> dict:
    """What the templates read: the answers, the switches, the requirement lines."""
    features = [name for name in answers.features if name in catalogue.FEATURES]
    return {
        "project_name": answers.project_name,
        "task": answers.task,
        "description": answers.description,
        # the templates know scaffold's features; a layer's come in at the points
        "features": features,
        **switches(features),
        "image": answers.task == "image-classification",
        "text": answers.task == "text-classification",
        "tokens": answers.task == "token-classification",
        "parallel": "ddp" if "ddp" in features else ("fsdp" if "fsdp" in features else ""),
        "scaffold_version": __version__,
        "requirements": requirements(answers.task, answers.features, answers.catalogue()),
    }


def _run_copier(dst: Path, templates: Path, data: dict) -> None:
    import copier

    try:
        with cache.jinja_code_cache():
            copier.run_copy(
                str(templates),
                str(dst),
                data=data,
                defaults=True,
                overwrite=True,
                quiet=True,
                unsafe=False,
                skip_tasks=True,
            )
    except Exception as exc:  # copier raises many types; present them as one line
        raise ScaffoldError(f"rendering the template failed: {exc}") from exc


def switches(features) -> dict[str, bool]:
    """The templates' switch for each of scaffold's features: `grad_accum` for grad-accum."""
    return {name.replace("-", "_"): name in features for name in catalogue.FEATURES}


def _collect(root: Path) -> dict[str, bytes]:
    files = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            files[path.relative_to(root).as_posix()] = path.read_bytes()
    return files


def format_file(path: str, data: bytes, own_modules: set[str] = frozenset()) -> bytes:
    """black's output for a `.py` file, its imports sorted (`scaffold.imports`; `own_modules`:
    the project's own, a section of their own), through the black cache; other files
    unchanged."""
    if not path.endswith(".py"):
        return data
    data = sort_imports(data.decode(), set(own_modules)).encode()
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


_TEMPLATE_SYNTAX = re.compile(rb"\{\{|\}\}|\{%|%\}|\{#|#\}|#@point |#@region |#@end ")


def _check_no_template_syntax(files: dict[str, bytes]) -> None:
    for path, data in files.items():
        if _TEMPLATE_SYNTAX.search(data):
            raise ScaffoldError(f"template syntax survived into {path}: report this bug")
