"""`scaffold upgrade`, `check`, `diff upgrade`: bring an edited project to the installed templates.

The project was rendered by template version A (its record says which; `scaffold.versions`); the
installed scaffold ships version B. `upgrade` is `add feature`'s three-way merge (scaffold.merge,
same engine, same rules) with other inputs, per file:

    base   = A's render: the pristine copy in `.scaffold/pristine.json`
    yours  = the file on disk, as the user edited it
    theirs = B's render of the same answers (task, features, name, description)

Before merging, the migrations that versions A+1..B declare (data in template_history.json: a
renamed file, a renamed Config field) are applied to the base and to your files alike, so your
edits follow a renamed file or flag instead of turning into conflicts. Files that B adds or drops
follow a feature's rules: a new file is created (a file of yours in its place is a conflict), a
dropped file is deleted if you never edited it and kept as a conflict otherwise. The merged files
and the new record (B's render as the pristine copy, B's version and fingerprint) are written as
one transaction (scaffold.lock.commit, under the project's lock). No template code runs: copier
renders with `unsafe=False` and no tasks, as for `new`.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from scaffold import __version__, layers
from scaffold.engine import (
    ChangeResult,
    FileChange,
    check_compiles,
    conflicted_files,
    find_git,
    generated_files,
    merge_one,
    project_style,
    read_file,
    refuse_unsafe,
    report_lists,
    unified_diff,
    user_python_files,
    write_result,
)
from scaffold.errors import ScaffoldError
from scaffold.lock import project_lock
from scaffold.record import load_record
from scaffold.render import black_version, installed_templates, record_of, render
from scaffold.versions import Migration, describe, migrations_between


@dataclass
class Installed:
    """The templates an upgrade goes to: the installed ones, or (tests) another folder."""

    fingerprint: str
    version: int | None
    templates: Path | None = None  # None: the installed templates
    migrations: list[Migration] | None = None  # None: from the history


def installed(templates: Path | None = None, version: int | None = None) -> Installed:
    fingerprint, shipped = installed_templates(templates)
    return Installed(fingerprint, shipped if version is None else version, templates)


def _up_to_date(record, target: Installed) -> bool:
    return record.template == target.fingerprint and record.black_version == black_version()


def _latest(answers):
    """(the answers with each team layer at its newest version, one line per layer that changed):
    a git layer is fetched and its ref resolved again; a directory layer is read as it is now."""
    if not answers.layers:
        return answers, []
    latest = answers.with_latest_layers()
    return latest, layers.changes(answers.layers, latest.layers)


def _refuse_downgrade(record, target: Installed) -> None:
    if (
        record.template_version is not None
        and target.version is not None
        and record.template_version > target.version
    ):
        raise ScaffoldError(
            f"this project was made by scaffold {record.scaffold_version} with template version "
            f"{record.template_version}, newer than this scaffold's ({__version__}, template "
            f"version {target.version}): upgrade scaffold (pip install -U scaffold-train)"
        )


# --- migrations ------------------------------------------------------------------------------


def _flag_patterns(migration: Migration):
    old_flag = "--" + migration.old.replace("_", "-")
    new_flag = "--" + migration.new.replace("_", "-")
    return [
        (re.compile(rf"(?<![\w-]){re.escape(old_flag)}(?![\w-])"), new_flag),
        (re.compile(rf"(?<!\w){re.escape(migration.old)}(?!\w)"), migration.new),
    ]


def _rename_flag(data: bytes, migration: Migration) -> bytes:
    try:  # renames apply to UTF-8 text; anything else is left alone
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return data
    if "\0" in text:
        return data
    for pattern, new in _flag_patterns(migration):
        text = pattern.sub(new, text)
    return text.encode("utf-8")


@dataclass
class Migrated:
    base: dict[str, bytes]  # the pristine files, migrated
    yours: dict[str, bytes | None] = field(default_factory=dict)  # your files it changed
    done: list[str] = field(default_factory=list)  # what it did, one line each
    notes: list[str] = field(default_factory=list)


def apply_migrations(project: Path, pristine: dict[str, bytes], migrations) -> Migrated:
    """Apply renames to the base and (in memory) to your files; nothing is written here."""
    state = Migrated(dict(pristine))

    def yours(rel):
        return state.yours[rel] if rel in state.yours else read_file(project, rel)

    for migration in migrations:
        touched = []
        if migration.kind == "rename_file":
            old, new = migration.old, migration.new
            if old not in state.base or new in state.base:
                continue  # not a file of this project (another task's, another feature's)
            state.base[new] = state.base.pop(old)
            data, there = yours(old), yours(new)
            if data is not None and there is None:
                state.yours[new], state.yours[old] = data, None
                touched = [old]
            elif data is not None:
                state.notes.append(
                    f"note: {new} exists already, so your {old} was not moved: merge them by hand"
                )
        else:
            for rel in sorted(state.base):
                state.base[rel] = _rename_flag(state.base[rel], migration)
                data = yours(rel)
                if data is not None and _rename_flag(data, migration) != data:
                    state.yours[rel] = _rename_flag(data, migration)
                    touched.append(rel)
            for rel in user_python_files(project, state.base):
                data = read_file(project, rel)
                if data is not None and _rename_flag(data, migration) != data:
                    state.notes.append(
                        f"note: your {rel} uses {migration.old}, renamed to {migration.new}: "
                        "change it yourself (scaffold changes only its generated files)"
                    )
        if touched:
            state.done.append(f"{migration.describe()} (in {', '.join(touched)})")
        else:
            state.done.append(f"{migration.describe()} (none of your files used it)")
    return state


# --- upgrade ---------------------------------------------------------------------------------


@dataclass
class UpgradeResult:
    from_version: int | None
    to_version: int | None
    change: ChangeResult
    migrations: list[str] = field(default_factory=list)
    up_to_date: bool = False


def upgrade_project(
    project: Path,
    *,
    dry_run: bool = False,
    allow_dirty: bool = False,
    echo: Callable[[str], None] = print,
    target: Installed | None = None,
    wait: float | None = None,
) -> UpgradeResult:
    """Merge the installed templates' render into the project at `project`, keeping your edits.

    Holds the project's lock (exclusive; shared for a dry run) for the whole command."""
    project = Path(project)
    with project_lock(project, write=not dry_run, command="upgrade", wait=wait, echo=echo):
        return _upgrade(project, dry_run, allow_dirty, echo, target)


def _upgrade(project: Path, dry_run, allow_dirty, echo, target) -> UpgradeResult:
    git = find_git()
    record = load_record(project)
    answers = record.answers
    target = target or installed()
    before = describe(record.template_version, record.template)
    after = describe(target.version, target.fingerprint)
    if record.template == target.fingerprint:  # only black differs: say so
        before = f"{before} (black {record.black_version})"
        after = f"{after} (black {black_version()})"
    latest, layer_changes = _latest(answers)
    if layer_changes and record.template == target.fingerprint:  # only a layer changed: say so
        before, after = f"{before} ({'; '.join(layer_changes)})", f"{after} (layers)"
    change = ChangeResult(list(answers.features), list(latest.features))
    result = UpgradeResult(record.template_version, target.version, change)
    up_to_date = _up_to_date(record, target) and not layer_changes
    if not conflicted_files(project, record.generated) and up_to_date:
        # (with markers left, an upgrade that ended in conflicts is up to date but not finished:
        # refused below, as add feature does)
        result.up_to_date = True
        echo(f"already at template {after} (scaffold {__version__}); nothing to do")
        return result
    in_git = refuse_unsafe(project, record, git, dry_run, allow_dirty)
    _refuse_downgrade(record, target)

    migrations = target.migrations
    if migrations is None:
        migrations = migrations_between(record.template_version or 0, target.version or 0)
    migrated = apply_migrations(project, generated_files(record.pristine), migrations)
    result.migrations = migrated.done
    change.notes += migrated.notes
    for line in layer_changes:
        echo(line)
    theirs = render(latest, target.templates)  # the new templates and layers
    # the new record names the version upgraded to (for another template folder, the one the
    # caller gave: tests upgrade to templates that no release shipped)
    record_files = record_of(latest, theirs, (target.fingerprint, target.version))

    style = project_style(project, migrated.base)
    for rel in sorted(set(migrated.base) | set(theirs)):
        kwargs = {"yours": migrated.yours[rel]} if rel in migrated.yours else {}
        base = migrated.base.get(rel)
        merge_one(project, rel, base, theirs.get(rel), git, change, style=style, **kwargs)
    _count_migrated_files(project, migrated, change)
    check_compiles(change)

    for note in change.notes:
        echo(note)
    for line in result.migrations:
        echo(f"migration: {line}")
    if dry_run:
        for item in change.changes:
            echo(unified_diff(item.path, item.before, item.after).rstrip("\n"))
        _report(result, before, after, echo, dry_run=True)
        return result

    write_result(project, change, record_files, record.generation, in_git, git, allow_dirty)
    _report(result, before, after, echo, dry_run=False)
    return result


def _count_migrated_files(project: Path, migrated: Migrated, change: ChangeResult) -> None:
    """A merge compares with your migrated files; what is written replaces the ones on disk."""
    by_path = {c.path: c for c in change.changes}
    for rel, data in sorted(migrated.yours.items()):
        disk = read_file(project, rel)
        item = by_path.get(rel)
        if item is not None:
            item.before = disk
            if item.after == disk:
                change.changes.remove(item)
        elif data != disk:
            action = "deleted" if data is None else "created" if disk is None else "migrated"
            change.changes.append(FileChange(rel, action, disk, data))
    change.changes.sort(key=lambda c: c.path)


def _report(result: UpgradeResult, before: str, after: str, echo, dry_run: bool) -> None:
    change = result.change
    report_lists(change, echo)
    if dry_run:
        echo(
            f"dry run: template {before} -> {after}; {len(change.changes)} files would change; "
            "nothing was written"
        )
    elif change.markers:
        echo(
            f"upgraded from template {before} to {after} with {change.markers} conflict(s): "
            "resolve the markers in the files above (the record already holds the new version); "
            "then run your tests"
        )
    elif change.to_resolve:
        echo(
            f"upgraded from template {before} to {after}, but {len(change.to_resolve)} items "
            "above need your hand (the record already holds the new version): fix them, then "
            "run your tests"
        )
    else:
        echo(
            f"upgraded from template {before} to {after}: {len(change.changes)} files changed, "
            "your edits kept"
        )


# --- diff upgrade, check, status -------------------------------------------------------------


def upgrade_diff(
    project: Path, target: Installed | None = None, *, wait=None, echo=None
) -> tuple[list[str], str]:
    """(migrations, patch): what the upgrade changes in the pristine files; nothing is written."""
    project = Path(project)
    with project_lock(project, write=False, command="diff upgrade", wait=wait, echo=echo):
        record = load_record(project)
    target = target or installed()
    latest, layer_changes = _latest(record.answers)
    if _up_to_date(record, target) and not layer_changes:
        return [], ""
    _refuse_downgrade(record, target)
    migrations = target.migrations
    if migrations is None:
        migrations = migrations_between(record.template_version or 0, target.version or 0)
    pristine = generated_files(record.pristine)
    # The pristine files as the migrations leave them; the user's files play no part.
    base, moved = dict(pristine), {}
    for migration in migrations:
        if migration.kind == "rename_file":
            if migration.old in base and migration.new not in base:
                base[migration.new] = base.pop(migration.old)
                moved[migration.new] = moved.pop(migration.old, migration.old)
        else:
            base = {rel: _rename_flag(data, migration) for rel, data in base.items()}
    theirs = render(latest, target.templates)
    parts = []
    for rel in sorted(set(base) | set(theirs)):
        old_rel = moved.get(rel, rel)
        before = pristine.get(old_rel) if rel in base else None
        after = theirs.get(rel)
        if before != after or old_rel != rel:
            parts.append(_patch(old_rel, rel, before, after))
    return [m.describe() for m in migrations], "".join(parts)


def _patch(old_rel: str, rel: str, before, after) -> str:
    a = [] if before is None else before.decode("utf-8", "replace").splitlines(keepends=True)
    b = [] if after is None else after.decode("utf-8", "replace").splitlines(keepends=True)
    lines = difflib.unified_diff(
        a, b,
        fromfile="/dev/null" if before is None else f"a/{old_rel}",
        tofile="/dev/null" if after is None else f"b/{rel}",
    )  # fmt: skip
    out = [] if old_rel == rel or before is None else [f"rename from {old_rel}\nrename to {rel}\n"]
    for line in lines:
        out.append(line)
        if not line.endswith("\n"):
            out.append("\n\\ No newline at end of file\n")
    return "".join(out)


def check_project(
    project: Path, target: Installed | None = None, *, wait=None, echo=None
) -> tuple[int, list[str]]:
    """(exit status, lines) for `scaffold check`: 0 up to date, 1 an upgrade is available.
    A damaged or foreign record raises ScaffoldError (the CLI exits 2)."""
    with project_lock(Path(project), write=False, command="check", wait=wait, echo=echo):
        record = load_record(Path(project))
    target = target or installed()
    _refuse_downgrade(record, target)
    before = describe(record.template_version, record.template)
    after = describe(target.version, target.fingerprint)
    _, layer_changes = _latest(record.answers)
    current = [f"layer {pin.name} {pin.version}" for pin in record.answers.layers]
    if _up_to_date(record, target) and not layer_changes:
        return 0, [f"up to date: template {after} (scaffold {__version__})", *current]
    if _up_to_date(record, target):
        return 1, [f"layer update available: {line}" for line in layer_changes] + [
            "see it with 'scaffold diff upgrade', apply it with 'scaffold upgrade'"
        ]
    if record.template == target.fingerprint:
        why = f"black {record.black_version} -> installed black (formatting)"
    else:
        why = f"template {before} -> {after}"
    return 1, [
        *(f"layer update available: {line}" for line in layer_changes),
        f"upgrade available: {why} (made by scaffold {record.scaffold_version}, "
        f"installed {__version__})",
        "see it with 'scaffold diff upgrade', apply it with 'scaffold upgrade'",
    ]
