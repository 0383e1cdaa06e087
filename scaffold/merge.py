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

Choices: adding a feature that is already enabled (or removing one that is not) is an error
(exit 1, "nothing to do"), so a typo never passes silently. Conflicts leave diff3 markers
(`<<<<<<< yours`, `||||||| base`, `=======`, `>>>>>>> theirs`) in the files, are listed, and give
exit status 1; the record already holds the new answers, and the next add/remove refuses to run
until the markers are gone.
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import os
import shutil
import subprocess
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from scaffold import __version__, catalogue
from scaffold.errors import ScaffoldError, UsageError
from scaffold.lock import commit, project_lock
from scaffold.paths import RECORD_DIR, in_record_dir
from scaffold.record import Record, load_record, sha256
from scaffold.render import base_is_current, black_version, render, template_fingerprint
from scaffold.versions import TEMPLATE_VERSION, describe

MARKER = "<<<<<<< yours"
LABELS = ("yours", "base", "theirs")


@dataclass
class FileChange:
    path: str
    action: str  # created, merged, updated, deleted
    before: Optional[bytes]  # the user's file (None: absent)
    after: Optional[bytes]  # what is written (None: deleted)
    conflicts: int = 0


@dataclass
class ChangeResult:
    """What `change_feature` did (or, with dry_run, would do)."""

    features_before: list[str]
    features_after: list[str]
    changes: list[FileChange] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)  # one line each: "path: why"
    notes: list[str] = field(default_factory=list)
    backup: Optional[Path] = None
    written: bool = False


# --- helpers ---------------------------------------------------------------------------------


def _git() -> str:
    git = shutil.which("git")
    if git is None:
        raise ScaffoldError(
            "git was not found on PATH: 'scaffold add/remove feature' merges with git "
            "(git merge-file); install git (https://git-scm.com) and run again"
        )
    return git


def _is_text(data: bytes) -> bool:
    if b"\0" in data:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _lf(data: bytes) -> bytes:
    return data.replace(b"\r\n", b"\n")


def _generated(files: dict[str, bytes]) -> dict[str, bytes]:
    """The project's own files of a render (without `.scaffold/`)."""
    return {p: d for p, d in files.items() if not in_record_dir(p)}


def _read(project: Path, rel: str) -> Optional[bytes]:
    path = project / rel
    if path.is_symlink() or path.is_file():
        try:
            return path.read_bytes()
        except OSError as exc:
            raise ScaffoldError(f"cannot read {rel}: {exc.strerror or exc}") from None
    if path.exists():
        raise ScaffoldError(f"{rel} is not a file (a directory?): move it away and run again")
    return None


def merge_file(yours: bytes, base: bytes, theirs: bytes, git: str) -> tuple[bytes, int]:
    """Three-way merge of LF-normalised text with `git merge-file`; (result, number of conflicts)."""
    with tempfile.TemporaryDirectory(prefix="scaffold-merge-") as tmp:
        paths = []
        for label, data in zip(LABELS, (yours, base, theirs)):
            path = os.path.join(tmp, label)
            with open(path, "wb") as f:
                f.write(data)
            paths.append(path)
        proc = subprocess.run(
            [git, "merge-file", "-p", "--diff3",
             "-L", LABELS[0], "-L", LABELS[1], "-L", LABELS[2], *paths],
            capture_output=True,
        )
    if proc.returncode < 0 or proc.returncode > 127:
        message = proc.stderr.decode(errors="replace").strip().splitlines()
        raise ScaffoldError(f"git merge-file failed: {message[0] if message else proc.returncode}")
    return proc.stdout, proc.returncode


def _git_repo(project: Path, git: str) -> bool:
    proc = subprocess.run(
        [git, "-C", str(project), "rev-parse", "--is-inside-work-tree"],
        capture_output=True, text=True,
    )
    return proc.returncode == 0 and proc.stdout.strip() == "true"


def _git_lines(project: Path, git: str, *args: str) -> list[str]:
    proc = subprocess.run([git, "-C", str(project), *args], capture_output=True)
    if proc.returncode != 0:
        message = proc.stderr.decode(errors="replace").strip().splitlines()
        command = next(a for a in args if not a.startswith("-"))
        raise ScaffoldError(f"git {command} failed in {project}: {message[0] if message else ''}")
    return [p for p in proc.stdout.decode(errors="replace").split("\0") if p]


def _dirty_files(project: Path, git: str) -> list[str]:
    """Tracked files under `project` with uncommitted changes (staged or not)."""
    entries = _git_lines(project, git, "status", "--porcelain=v1", "-z", "--untracked-files=no",
                         "--", ".")
    names, skip = set(), False
    for entry in entries:
        if skip:  # the source path of a rename or copy
            skip = False
            continue
        names.add(entry[3:])
        skip = entry[:1] in ("R", "C")
    return sorted(names)


def _conflicted_files(project: Path, paths) -> list[str]:
    marked = []
    for rel in sorted(paths):
        path = project / rel
        if not path.is_file():
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if any(line.startswith(MARKER.encode()) for line in data.splitlines()):
            marked.append(rel)
    return marked


def _check_feature_name(name: str) -> None:
    if name not in catalogue.FEATURES:
        catalogue.resolve_features([name])  # raises the catalogue's UsageError for an unknown name


def _new_features(current: list[str], name: str, add: bool) -> list[str]:
    """The features after the change, or a ScaffoldError saying why not (with a hint)."""
    _check_feature_name(name)
    enabled = ", ".join(current) or "none"
    if add:
        if name in current:
            raise ScaffoldError(
                f"feature {name!r} is already enabled in this project (features: {enabled}); "
                "nothing to do"
            )
        missing = [r for r in catalogue.FEATURES[name].requires if r not in current]
        if missing:
            raise UsageError(
                f"feature {name!r} requires {', '.join(map(repr, missing))}, which this project "
                f"does not have: run 'scaffold add feature {missing[0]}' first"
            )
        clashes = [c for c in current if c in catalogue.FEATURES[name].conflicts
                   or name in catalogue.FEATURES[c].conflicts]
        if clashes:
            raise UsageError(
                f"feature {name!r} conflicts with {clashes[0]!r}, which this project has: "
                f"run 'scaffold remove feature {clashes[0]}' first"
            )
        return catalogue.resolve_features([*current, name])
    if name not in current:
        raise ScaffoldError(
            f"feature {name!r} is not enabled in this project (features: {enabled}); nothing to do"
        )
    needed_by = [f for f in current if f != name and name in catalogue.FEATURES[f].requires]
    if needed_by:
        raise UsageError(
            f"feature {name!r} is required by {', '.join(map(repr, needed_by))}, which this "
            f"project has: run 'scaffold remove feature {needed_by[0]}' first"
        )
    return catalogue.resolve_features([f for f in current if f != name])


def _base_files(record: Record, notes: list[str], name: str) -> dict[str, bytes]:
    """The merge base: the stored pristine copy, rendered by the installed templates.

    A project made by other templates (or another black) is refused: merging the feature
    against a re-rendered base would mark the project as made by the installed templates
    without their changes, and `scaffold upgrade` would never bring them."""
    if base_is_current(record):
        return _generated(record.pristine)
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
    wait: Optional[float] = None,
) -> ChangeResult:
    """Add (or remove) feature `name` in the project at `project`, keeping the user's edits.

    Holds the project's lock (exclusive; shared for a dry run) for the whole command."""
    project = Path(project)
    command = f"{'add' if add else 'remove'} feature {name}"
    with project_lock(project, write=not dry_run, command=command, wait=wait, echo=echo):
        return _change_feature(project, name, add, dry_run, allow_dirty, echo)


def _change_feature(project: Path, name: str, add, dry_run, allow_dirty, echo) -> ChangeResult:
    git = _git()
    record = load_record(project)
    old_answers = record.answers
    new_features = _new_features(old_answers.features, name, add)

    marked = _conflicted_files(project, record.generated)
    if marked:
        raise ScaffoldError(
            f"unresolved conflict markers ({MARKER}) in {', '.join(marked)}: resolve them "
            "(keep the lines you want, delete the <<<<<<< ||||||| ======= >>>>>>> lines) and run again"
        )
    in_git = _git_repo(project, git)
    if in_git and not dry_run and not allow_dirty:
        names = _dirty_files(project, git)
        if names:
            shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            raise ScaffoldError(
                f"uncommitted changes to tracked files ({shown}): commit or stash them first, so "
                "that git can show and undo the merge, or pass --allow-dirty"
            )

    result = ChangeResult(features_before=list(old_answers.features), features_after=new_features)
    base_files = _base_files(record, result.notes, name)
    rendered = render(dataclasses.replace(old_answers, features=tuple(new_features)))
    theirs_files = _generated(rendered)
    record_files = {p: d for p, d in rendered.items() if p not in theirs_files}

    for rel in sorted(set(base_files) | set(theirs_files)):
        _merge_one(project, rel, base_files.get(rel), theirs_files.get(rel), git, result)

    _check_compiles(result)
    verb = "add" if add else "remove"
    for note in result.notes:
        echo(note)
    if dry_run:
        for change in result.changes:
            echo(_unified(change.path, change.before, change.after).rstrip("\n"))
        _report(result, echo, verb, name, project, dry_run=True)
        return result

    writes = {c.path: c.after for c in result.changes}
    existing = [p for p in writes if (project / p).is_file()]
    if existing and not in_git:
        result.backup = _backup(project, existing)
    elif existing and in_git:
        tracked = _git_lines(project, git, "--literal-pathspecs", "ls-files", "-z", "--", *existing)
        untracked = sorted(set(existing) - set(tracked))
        if untracked:  # in a repository, but git could not give these back
            result.backup = _backup(project, untracked)
    try:
        # One transaction (scaffold.write.write_files): all of it or nothing, the record last;
        # refused if the record changed since it was read.
        commit(project, {**writes, **record_files}, record.generation)
    except OSError as exc:
        raise ScaffoldError(
            f"writing the merged files failed ({exc.strerror or exc}); the next scaffold command "
            "in this project finishes or undoes a half-done write: fix the cause, then run "
            "'scaffold status'"
            + (f" (your previous files are in {result.backup})" if result.backup else "")
        ) from None
    result.written = True
    _report(result, echo, verb, name, project, dry_run=False)
    return result


_ON_DISK = object()


def _merge_one(
    project: Path, rel: str, base, theirs, git: str, result: ChangeResult, yours=_ON_DISK
) -> None:
    """`yours`: the user's file as `scaffold upgrade`'s migrations left it (default: on disk)."""
    if base == theirs:
        return  # the change does not touch this file: leave the user's version alone
    if yours is _ON_DISK:
        yours = _read(project, rel)
    if base is None:  # the change adds this file
        if yours is None:
            result.changes.append(FileChange(rel, "created", None, theirs))
        elif _lf(yours) != _lf(theirs):
            result.conflicts.append(
                f"{rel}: the feature adds this file, but a file of yours is already there; not "
                "overwritten (see the feature's version with 'scaffold diff feature')"
            )
        return
    if theirs is None:  # the change removes this file
        if yours is None:
            return
        if _lf(yours) == _lf(base):
            result.changes.append(FileChange(rel, "deleted", yours, None))
        else:
            result.conflicts.append(
                f"{rel}: the change removes this file, but you edited it; kept: delete it "
                "yourself once nothing uses it"
            )
        return
    if yours is None:
        result.notes.append(
            f"note: {rel}: you deleted it; left deleted (the change would have updated it)"
        )
        return
    if not (_is_text(yours) and _is_text(base) and _is_text(theirs)):  # binary: bytes only
        if yours == base:
            result.changes.append(FileChange(rel, "updated", yours, theirs))
        elif yours != theirs:
            result.conflicts.append(
                f"{rel}: binary file changed by you and by the change; kept yours"
            )
        return
    # The user's line-ending style is not an edit: merge LF text with a final newline, then
    # give the result the user's style back (CRLF; no newline at the end of the file).
    crlf = b"\r\n" in yours
    ours = _lf(yours)
    no_final_newline = bool(ours) and not ours.endswith(b"\n") and base.endswith(b"\n")
    if no_final_newline:
        ours += b"\n"
    if ours == base:
        merged, count = theirs, 0
    elif ours == theirs:
        return
    else:
        merged, count = merge_file(ours, base, theirs, git)
    if no_final_newline and merged.endswith(b"\n"):
        merged = merged[:-1]
    if crlf:
        merged = merged.replace(b"\n", b"\r\n")
    if merged == yours:
        return
    result.changes.append(
        FileChange(rel, "merged" if ours != base else "updated", yours, merged, conflicts=count)
    )
    if count:
        result.conflicts.append(
            f"{rel}: {count} conflict{'s' if count > 1 else ''} (marked {MARKER} ... >>>>>>> theirs)"
        )


def _check_compiles(result: ChangeResult) -> None:
    for change in result.changes:
        if change.path.endswith(".py") and change.after is not None and not change.conflicts:
            try:
                with warnings.catch_warnings():  # e.g. an invalid escape: not this command's business
                    warnings.simplefilter("ignore")
                    compile(change.after, change.path, "exec", dont_inherit=True)
            except (SyntaxError, ValueError) as exc:
                where = f"line {exc.lineno}: " if getattr(exc, "lineno", None) else ""
                why = exc.msg if isinstance(exc, SyntaxError) else str(exc)
                before = "" if _compiles(change.before) else ", nor did your file before the merge"
                result.conflicts.append(
                    f"{change.path}: the merged file does not compile ({where}{why}{before}); "
                    "fix it by hand"
                )


def _compiles(data: Optional[bytes]) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(data or b"", "<file>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


def _backup(project: Path, paths: list[str]) -> Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    folder = project / RECORD_DIR / f"backup-{stamp}"
    n = 1
    while folder.exists():
        n += 1
        folder = project / RECORD_DIR / f"backup-{stamp}-{n}"
    for rel in paths:
        source = project / rel
        if source.is_file():
            target = folder / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _report(result: ChangeResult, echo, verb: str, name: str, project: Path, dry_run: bool) -> None:
    would = "would be " if dry_run else ""
    for change in result.changes:
        extra = f" ({change.conflicts} conflict{'s' if change.conflicts > 1 else ''})" if change.conflicts else ""
        echo(f"  {change.action:<8} {change.path}{extra}")
    if result.backup is not None:
        echo(f"backup of the files about to change: {result.backup}")
    if result.conflicts:
        echo(f"conflicts ({len(result.conflicts)}):")
        for line in result.conflicts:
            echo(f"  {line}")
    past = "added" if verb == "add" else "removed"
    if dry_run:
        echo(f"dry run: feature {name!r} {would}{past}; {len(result.changes)} files would change; "
             "nothing was written")
    elif result.conflicts:
        echo(f"feature {name!r} {past} with conflicts: resolve the markers in the files above "
             "(the record already lists the new features); then run your tests")
    else:
        echo(f"feature {name!r} {past}: {len(result.changes)} files changed, your edits kept "
             f"(features: {', '.join(result.features_after) or 'none'})")


def _unified(rel: str, before: Optional[bytes], after: Optional[bytes]) -> str:
    a = [] if before is None else before.decode("utf-8", "replace").splitlines(keepends=True)
    b = [] if after is None else after.decode("utf-8", "replace").splitlines(keepends=True)
    lines = difflib.unified_diff(
        a, b,
        fromfile="/dev/null" if before is None else f"a/{rel}",
        tofile="/dev/null" if after is None else f"b/{rel}",
    )
    out = []
    for line in lines:
        out.append(line)
        if not line.endswith("\n"):
            out.append("\n\\ No newline at end of file\n")
    return "".join(out)


# --- diff feature ----------------------------------------------------------------------------


def feature_diff(project: Path, name: str, *, wait: Optional[float] = None, echo=None) -> str:
    """The patch feature `name` contributes to this project: render without it -> with it."""
    command = f"diff feature {name}"
    with project_lock(Path(project), write=False, command=command, wait=wait, echo=echo):
        return _feature_diff(Path(project), name)


def _feature_diff(project: Path, name: str) -> str:
    record = load_record(Path(project))
    _check_feature_name(name)
    answers = record.answers
    current = list(answers.features)
    try:
        if name in current:
            other = _new_features(current, name, add=False)
        else:
            other = _new_features(current, name, add=True)
    except UsageError as exc:
        raise UsageError(f"cannot show {name!r} for this project: {exc}") from None
    other_answers = dataclasses.replace(answers, features=tuple(other))
    if base_is_current(record):
        this_render = _generated(record.pristine)  # already the render of the current answers
    else:
        this_render = _generated(render(answers))
    other_render = _generated(render(other_answers))
    without, with_ = (other_render, this_render) if name in current else (this_render, other_render)
    parts = []
    for rel in sorted(set(without) | set(with_)):
        if without.get(rel) != with_.get(rel):
            parts.append(_unified(rel, without.get(rel), with_.get(rel)))
    return "".join(parts)


# --- status ----------------------------------------------------------------------------------

_SKIP_DIRS = {"__pycache__", "runs", "node_modules", "site-packages", "build", "dist"}


def _user_python_files(project: Path, known) -> list[str]:
    found = []
    for root, dirs, files in os.walk(project):
        dirs[:] = sorted(
            d for d in dirs
            if not d.startswith(".") and d not in _SKIP_DIRS
            and not (Path(root) / d / "pyvenv.cfg").exists()
        )
        for name in sorted(files):
            if name.endswith(".py"):
                rel = (Path(root) / name).relative_to(project).as_posix()
                if rel not in known:
                    found.append(rel)
    return found


def project_status(project: Path, *, wait: Optional[float] = None, echo=None) -> list[str]:
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
    generated = record.generated
    changed, deleted = [], []
    for rel in sorted(generated):
        try:
            data = _read(project, rel)
        except ScaffoldError:  # unreadable, or a directory now: not as rendered
            changed.append(rel)
            continue
        if data is None:
            deleted.append(rel)
        elif sha256(data) != generated[rel]:
            changed.append(rel)
    added = _user_python_files(project, generated)
    marked = _conflicted_files(project, generated)
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
