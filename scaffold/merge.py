"""`scaffold add/remove feature`, `diff feature` and `status`: change an edited project's features.

A three-way merge per file, with git's own engine (`git merge-file --diff3`):

    base   = the pristine copy of the last render, stored in `.scaffold/pristine.json`
    yours  = the file on disk, as the user edited it
    theirs = a fresh render with the new answers

If the installed templates (or black) differ from the ones that made the project, add/remove is
refused until `scaffold upgrade` (scaffold.upgrade) has brought the project to them. Every file
is merged in memory first; the results and the new record (answers + pristine copy, last) are
then written as one transaction (`scaffold.write.write_files`): a failure before
that writes nothing, and a write killed halfway is finished by the next scaffold command.

The merge itself is scaffold.engine's (`merge_text` per file, `merge_one` per path of the
project); this module decides what the merge is between (the base and theirs renders for a
feature change), then checks the result for a removed feature's leftovers (scaffold.meaning).

Choices: adding a feature that is already enabled (or removing one that is not) is refused (exit 2,
"nothing to do"), so a typo never passes silently. Conflicts leave diff3 markers (`<<<<<<< yours`,
`||||||| base`, `=======`, `>>>>>>> theirs`) in the files; they, the undefined names and the
leftovers are listed by file and line and give exit status 1 (done, with conflicts to resolve); the
record already holds the new answers, and the next add/remove refuses to run until the markers are
gone. A file that cannot be merged as text stops the command before anything is written.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from scaffold import __version__, catalogue, textio
from scaffold.engine import (
    ChangeResult,
    check_compiles,
    conflicted_files,
    find_git,
    generated_files,
    merge_one,
    no_interrupts,
    plural,
    project_style,
    read_file,
    refuse_unsafe,
    report_lists,
    unified_diff,
    user_python_files,
    write_result,
)
from scaffold.errors import ScaffoldError, UsageError
from scaffold.lock import project_lock
from scaffold.meaning import Gone, bound_names, config_fields, find_leftovers, name_tokens
from scaffold.record import RECORD_FILE, Record, load_record, sha256
from scaffold.render import (
    base_is_current,
    black_version,
    record_of,
    render,
    template_fingerprint,
)
from scaffold.versions import TEMPLATE_VERSION, describe


def find_project(start: Path) -> Path:
    """The nearest folder at or above `start` holding `.scaffold/record.json` (else `start`)."""
    start = Path(start)
    try:
        here = start.resolve()
    except (OSError, RuntimeError):
        return start
    for folder in (here, *here.parents):
        if (folder / RECORD_FILE).is_file():
            return folder if folder != here else start
    return start


def _check_feature_name(name: str, features: dict | None = None) -> None:
    features = catalogue.FEATURES if features is None else features
    if name not in features:
        # raises the catalogue's UsageError for an unknown name
        catalogue.resolve_features([name], features)


def _new_features(
    current: list[str], name: str, add: bool, features: dict | None = None
) -> list[str]:
    """The features after the change, or a ScaffoldError saying why not (with a hint).

    `features`: the catalogue (scaffold's, plus the project's layers' features)."""
    features = catalogue.FEATURES if features is None else features
    _check_feature_name(name, features)
    enabled = ", ".join(current) or "none"
    if add:
        if name in current:
            raise ScaffoldError(
                f"feature {name!r} is already enabled in this project (features: {enabled}); "
                "nothing to do"
            )
        missing = [r for r in features[name].requires if r not in current]
        if missing:
            raise UsageError(
                f"feature {name!r} requires {', '.join(map(repr, missing))}, which this project "
                f"does not have: run 'scaffold add feature {missing[0]}' first"
            )
        clashes = [
            c for c in current if c in features[name].conflicts or name in features[c].conflicts
        ]
        if clashes:
            raise UsageError(
                f"feature {name!r} conflicts with {clashes[0]!r}, which this project has: "
                f"run 'scaffold remove feature {clashes[0]}' first"
            )
        return catalogue.resolve_features([*current, name], features)
    if name not in current:
        raise ScaffoldError(
            f"feature {name!r} is not enabled in this project (features: {enabled}); nothing to do"
        )
    needed_by = [f for f in current if f != name and name in features[f].requires]
    if needed_by:
        raise UsageError(
            f"feature {name!r} is required by {', '.join(map(repr, needed_by))}, which this "
            f"project has: run 'scaffold remove feature {needed_by[0]}' first"
        )
    return catalogue.resolve_features([f for f in current if f != name], features)


def _base_files(record: Record, notes: list[str], name: str) -> dict[str, bytes]:
    """The merge base: the stored pristine copy, rendered by the installed templates.

    A project made by other templates (or another black) is refused: merging the feature
    against a re-rendered base would mark the project as made by the installed templates
    without their changes, and `scaffold upgrade` would never bring them."""
    if base_is_current(record):
        return generated_files(record.pristine)
    if record.is_from(template_fingerprint(), black_version()):  # a directory layer changed
        raise ScaffoldError(
            f"the layer of this project changed since it was rendered "
            f"({', '.join(f'{p.name} {p.version}' for p in record.answers.layers)}): run "
            "'scaffold upgrade' first, so that the layer's own changes are not skipped"
        )
    raise ScaffoldError(
        f"this project has template {describe(record.template_version, record.template)} "
        f"(black {record.black_version}); the installed scaffold has template "
        f"{describe(TEMPLATE_VERSION, template_fingerprint())} (black {black_version()}): run "
        "'scaffold upgrade' first, so that the template's own changes are not skipped"
    )


# --- add / remove ----------------------------------------------------------------------------


def change_feature(
    project: Path,
    name: str,
    *,
    add: bool,
    dry_run: bool = False,
    allow_dirty: bool = False,
    echo: Callable[[str], None] = print,
    wait: float | None = None,
) -> ChangeResult:
    """Add (or remove) feature `name` in the project at `project`, keeping the user's edits.

    Holds the project's lock (exclusive; shared for a dry run) for the whole command."""
    project = Path(project)
    command = f"{'add' if add else 'remove'} feature {name}"
    with project_lock(project, write=not dry_run, command=command, wait=wait, echo=echo):
        return _change_feature(project, name, add, dry_run, allow_dirty, echo)


def _change_feature(project: Path, name: str, add, dry_run, allow_dirty, echo) -> ChangeResult:
    git = find_git()
    record = load_record(project)
    old_answers = record.answers
    new_features = _new_features(old_answers.features, name, add, old_answers.catalogue())
    for layer in old_answers.loaded_layers() if not add else ():
        if name in layer.always:
            raise UsageError(
                f"feature {name!r} is always on in layer {layer.name!r}: "
                "it cannot be removed from a project of that layer"
            )

    in_git = refuse_unsafe(project, record, git, dry_run, allow_dirty)

    result = ChangeResult(features_before=list(old_answers.features), features_after=new_features)
    base_files = _base_files(record, result.notes, name)
    new_answers = dataclasses.replace(old_answers, features=tuple(new_features))
    theirs_files = render(new_answers)
    record_files = record_of(new_answers, theirs_files)

    gone = _gone(base_files, theirs_files, result)
    style = project_style(project, base_files)
    folders = {rel.rsplit("/", 1)[0] for rel in base_files if "/" in rel}
    deleted = {
        d
        for d in folders  # a folder none of whose generated files the user kept
        if not any((project / r).exists() for r in base_files if r.startswith(d + "/"))
    }
    for rel in sorted(set(base_files) | set(theirs_files)):
        folder = rel.rsplit("/", 1)[0] if "/" in rel else ""
        if rel not in base_files and folder in deleted:
            result.notes.append(f"note: {folder}/: you deleted it; {rel} not created")
            continue
        merge_one(
            project,
            rel,
            base_files.get(rel),
            theirs_files.get(rel),
            git,
            result,
            style=style,
            gone=gone,
        )
    _scan_unchanged(project, record, result, gone)

    check_compiles(result)
    verb = "add" if add else "remove"
    for note in result.notes:
        echo(note)
    if dry_run:
        for change in result.changes:
            echo(unified_diff(change.path, change.before, change.after).rstrip("\n"))
        _report(result, echo, verb, name, project, dry_run=True)
        return result

    write_result(project, result, record_files, record.generation, in_git, git, allow_dirty)
    with no_interrupts():  # everything is written: a Ctrl-C now must not turn it into a failure
        _report(result, echo, verb, name, project, dry_run=False)
    return result


def _gone(base_files: dict[str, bytes], theirs_files: dict[str, bytes], result: ChangeResult):
    """What a change takes away (scaffold.meaning.Gone): removed features' tags, names, fields."""

    removed = [f for f in result.features_before if f not in result.features_after]
    if not removed:
        return None
    who = f"feature {removed[0]!r}" if len(removed) == 1 else "the removed features"

    def texts(files):
        return [d.decode("utf-8", "replace") for p, d in files.items() if p.endswith(".py")]

    left = set().union(*map(name_tokens, texts(theirs_files)))
    before = texts(base_files)
    names = set().union(*map(bound_names, before)) - left
    fields = set().union(*map(config_fields, before)) - set().union(
        *map(config_fields, texts(theirs_files))
    )
    return Gone(
        features=tuple(removed),
        names={n: who for n in sorted(names) if not n.startswith("__")},
        fields={f: who for f in sorted(fields)},
    )


def _scan_unchanged(project: Path, record, result: ChangeResult, gone) -> None:
    """Leftovers in the Python files the merge did not touch (generated or the user's own)."""

    if gone is None:
        return
    touched = {c.path for c in result.changes} | {line.split(":")[0] for line in result.conflicts}
    generated = [p for p in record.hashes if p.endswith(".py") and not p.startswith(".scaffold/")]
    for rel in sorted(set(generated) | set(user_python_files(project, record.hashes))):
        if rel in touched:
            continue
        try:
            data = read_file(project, rel)
        except ScaffoldError:
            continue
        text = textio.decode(data, python=True) if data is not None else None
        if text is not None:  # a name the file binds itself is its own, not a leftover
            result.leftovers += find_leftovers(rel, text.text, gone, yours=text.text)


def _report(result: ChangeResult, echo, verb: str, name: str, project: Path, dry_run: bool) -> None:
    would = "would be " if dry_run else ""
    report_lists(result, echo)
    past = "added" if verb == "add" else "removed"
    if dry_run:
        echo(
            f"dry run: feature {name!r} {would}{past}; {len(result.changes)} files would change; "
            "nothing was written"
        )
    elif result.markers:
        echo(
            f"feature {name!r} {past} with {plural(result.markers, 'conflict')}: resolve the "
            "markers in the files above (the record already lists the new features); then run "
            "your tests"
        )
    elif result.to_resolve:
        echo(
            f"feature {name!r} {past} in the generated code, but {len(result.to_resolve)} "
            "items above need your hand (the record already lists the new features): fix them, "
            "then run your tests"
        )
    else:
        echo(
            f"feature {name!r} {past}: {len(result.changes)} files changed, your edits kept "
            f"(features: {', '.join(result.features_after) or 'none'})"
        )


# --- diff feature ----------------------------------------------------------------------------


def feature_diff(project: Path, name: str, *, wait: float | None = None, echo=None) -> str:
    """The patch feature `name` contributes to this project: render without it -> with it."""
    command = f"diff feature {name}"
    with project_lock(Path(project), write=False, command=command, wait=wait, echo=echo):
        return _feature_diff(Path(project), name)


def _feature_diff(project: Path, name: str) -> str:
    record = load_record(Path(project))
    answers = record.answers
    features = answers.catalogue()
    _check_feature_name(name, features)
    current = list(answers.features)
    try:
        if name in current:
            other = _new_features(current, name, False, features)
        else:
            other = _new_features(current, name, True, features)
    except UsageError as exc:
        raise UsageError(f"cannot show {name!r} for this project: {exc}") from None
    other_answers = dataclasses.replace(answers, features=tuple(other))
    if base_is_current(record):
        this_render = generated_files(record.pristine)  # already the render of the current answers
    else:
        this_render = render(answers)
    other_render = render(other_answers)
    without, with_ = (other_render, this_render) if name in current else (this_render, other_render)
    parts = []
    for rel in sorted(set(without) | set(with_)):
        if without.get(rel) != with_.get(rel):
            parts.append(unified_diff(rel, without.get(rel), with_.get(rel)))
    return "".join(parts)


def project_status(project: Path, *, wait: float | None = None, echo=None) -> list[str]:
    """What made this project, its task and features, and what the user changed since."""
    with project_lock(Path(project), write=False, command="status", wait=wait, echo=echo):
        return _project_status(Path(project))


def template_line(record: Record) -> str:
    """The `made by:` line of `scaffold status`: scaffold and template versions, and whether
    `scaffold upgrade` has something to do."""
    made = f"scaffold {record.scaffold_version}, template "
    made += describe(record.template_version, record.template)
    installed = f"scaffold {__version__}, template "
    installed += describe(TEMPLATE_VERSION, template_fingerprint())
    if base_is_current(record):
        return f"made by: {made} (installed: {installed}; up to date)"
    if record.template_version is not None and record.template_version > TEMPLATE_VERSION:
        return f"made by: {made} (installed: {installed}, older: upgrade scaffold)"
    return (
        f"made by: {made} (installed: {installed}; an upgrade is available: 'scaffold diff "
        "upgrade' shows it, 'scaffold upgrade' applies it)"
    )


def _project_status(project: Path) -> list[str]:
    record = load_record(project)
    answers = record.answers
    lines = [
        f"project: {answers.project_name} ({project.resolve()})",
        template_line(record),
        f"task: {answers.task}",
        f"features: {', '.join(answers.features) or 'none'}",
    ]
    for pin in answers.layers:  # the identity: a git commit, or a hash of a directory's files
        lines.insert(-2, f"layer: {pin.name} {pin.version} ({pin.source} @ {pin.identity[:19]})")
    generated = record.generated
    changed, deleted = [], []
    for rel in sorted(generated):
        try:
            data = read_file(project, rel)
        except ScaffoldError:  # unreadable, or a directory now: not as rendered
            changed.append(rel)
            continue
        if data is None:
            deleted.append(rel)
        elif sha256(data) != generated[rel]:
            changed.append(rel)
    added = user_python_files(project, generated)
    marked = conflicted_files(project, generated)
    if not (changed or deleted or added):
        lines.append("files: all generated files as rendered; no Python files added")
    else:
        lines.append("since the last render:")
        lines += [f"  modified  {p}" for p in changed]
        lines += [f"  deleted   {p}" for p in deleted]
        lines += [f"  added     {p}" for p in added]
    if marked:
        lines.append(f"unresolved conflict markers in: {', '.join(marked)}")
    return lines
