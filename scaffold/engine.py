"""The merge engine: a three-way merge of one file, and of a project's files, checked and written.

`merge_text` merges one text file (base, yours, theirs -> a checked `TextMerge`) with git's own
engine (`git merge-file --diff3`): the user's encoding and line endings (scaffold.textio), the
user's formatting (scaffold.style), conflicts where neither side changed what the other did settled
and listed, then the merged Python checked for names it leaves undefined (scaffold.meaning).
`merge_one` does it for one path of a project (created, deleted, binary and unchanged files
included) into a `ChangeResult`; `check_compiles`, `refuse_unsafe`, `write_result` (a backup,
then one transaction with the record) and `report_lists` are the steps every command that merges
shares. `scaffold add/remove feature` (scaffold.merge) and `scaffold upgrade` (scaffold.upgrade)
use this module through these public names only.
"""

from __future__ import annotations

import contextlib
import datetime
import difflib
import os
import shutil
import subprocess
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from scaffold import meaning, textio, write
from scaffold.errors import ScaffoldError
from scaffold.lock import commit
from scaffold.paths import RECORD_DIR, in_record_dir
from scaffold.record import Record
from scaffold.style import detect, similarity

MARKER = "<<<<<<< yours"
LABELS = ("yours", "base", "theirs")
KEEP_BACKUPS = 3  # .scaffold/backup-* folders kept (the newest)


@dataclass
class FileChange:
    path: str
    action: str  # created, merged, updated, deleted
    before: bytes | None  # the user's file (None: absent)
    after: bytes | None  # what is written (None: deleted)
    conflicts: int = 0


@dataclass
class ChangeResult:
    """What `change_feature` did (or, with dry_run, would do)."""

    features_before: list[str]
    features_after: list[str]
    changes: list[FileChange] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)  # one line each: "path: why"
    notes: list[str] = field(default_factory=list)
    auto_resolved: list[str] = field(default_factory=list)  # "path:line: what was done"
    problems: list[str] = field(default_factory=list)  # "path:line uses `x`; why"
    leftovers: list[str] = field(default_factory=list)  # "path:line: what to delete"

    @property
    def markers(self) -> int:
        return sum(c.conflicts for c in self.changes)

    @property
    def to_resolve(self) -> list[str]:
        """Everything the user must look at: conflicts, then problems, then leftovers."""
        return [*self.conflicts, *self.problems, *self.leftovers]

    @property
    def exit_code(self) -> int:
        """0: done, clean; 1: done, with conflicts to resolve."""
        return 1 if self.to_resolve else 0

    backup: Path | None = None
    written: bool = False


# --- helpers ---------------------------------------------------------------------------------


def find_git() -> str:
    git = shutil.which("git")
    if git is None:
        raise ScaffoldError(
            "git was not found on PATH: 'scaffold add/remove feature' merges with git "
            "(git merge-file); install git (https://git-scm.com) and run again"
        )
    return git


def _lf(data: bytes) -> bytes:
    return data.replace(b"\r\n", b"\n")


def generated_files(files: dict[str, bytes]) -> dict[str, bytes]:
    """The project's own files of a render (without `.scaffold/`)."""
    return {p: d for p, d in files.items() if not in_record_dir(p)}


def read_file(project: Path, rel: str) -> bytes | None:
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
    """Three-way merge of LF-normalised text with `git merge-file`: (result, conflict count)."""
    with tempfile.TemporaryDirectory(prefix="scaffold-merge-") as tmp:
        paths = []
        for label, data in zip(LABELS, (yours, base, theirs)):
            path = os.path.join(tmp, label)
            with open(path, "wb") as f:
                f.write(data)
            paths.append(path)
        proc = subprocess.run(
            [
                git,
                "merge-file",
                "-p",
                "--diff3",
                "-L",
                LABELS[0],
                "-L",
                LABELS[1],
                "-L",
                LABELS[2],
                *paths,
            ],
            capture_output=True,
        )
    if proc.returncode < 0 or proc.returncode > 127:
        message = proc.stderr.decode(errors="replace").strip().splitlines()
        raise ScaffoldError(f"git merge-file failed: {message[0] if message else proc.returncode}")
    return proc.stdout, proc.returncode


# --- the per-file engine (add/remove feature today; `scaffold upgrade` next) -------------------


@dataclass
class TextMerge:
    """One file merged: the bytes to write and everything the user must hear about."""

    path: str
    data: bytes | None  # the result, in the user's encoding and line endings
    markers: int = 0  # conflict blocks left in the file (<<<<<<< yours ... >>>>>>> theirs)
    auto_resolved: list[str] = field(default_factory=list)  # "path:line: what was done"
    problems: list[str] = field(default_factory=list)  # undefined names etc. the merge introduced
    leftovers: list[str] = field(default_factory=list)  # what a removed feature left behind


class CannotMerge(Exception):
    """This file cannot be merged as text: the whole command must stop before writing."""


def _conflict_blocks(lines: list[str]):
    """Split git's diff3 output into plain lines (str) and conflicts ((yours, base, theirs))."""
    out, i = [], 0
    while i < len(lines):
        if lines[i].startswith(MARKER) and lines[i].rstrip("\n") == MARKER:
            parts, current, i = [[], [], []], 0, i + 1
            while i < len(lines) and not (
                current == 2 and lines[i].rstrip("\n") == ">>>>>>> theirs"
            ):
                stripped = lines[i].rstrip("\n")
                if current == 0 and stripped == "||||||| base":
                    current = 1
                elif current == 1 and stripped == "=======":
                    current = 2
                else:
                    parts[current].append(lines[i])
                i += 1
            out.append(tuple(parts))
        else:
            out.append(lines[i])
        i += 1
    return out


def _join(blocks, choice) -> str:
    text = []
    for k, block in enumerate(blocks):
        if isinstance(block, str):
            text.append(block)
        else:
            text.extend(choice(k, block))
    return "".join(text)


def _marked(block) -> list[str]:
    yours, base, theirs = block
    return [
        MARKER + "\n",
        *yours,
        "||||||| base\n",
        *base,
        "=======\n",
        *theirs,
        ">>>>>>> theirs\n",
    ]


def _both_inserted(yours: list[str], theirs: list[str]) -> list[list[str]]:
    """Ways to keep two insertions at one place: the change's lines first, then the user's."""
    prefix = 0
    while prefix < min(len(yours), len(theirs)) and yours[prefix] == theirs[prefix]:
        prefix += 1
    suffix = 0
    while (
        suffix < min(len(yours), len(theirs)) - prefix
        and yours[len(yours) - 1 - suffix] == theirs[len(theirs) - 1 - suffix]
    ):
        suffix += 1
    head, tail = yours[:prefix], yours[len(yours) - suffix :]
    mine, new = yours[prefix : len(yours) - suffix], theirs[prefix : len(theirs) - suffix]
    if not mine or not new:
        return [head + (mine or new) + tail]
    # blank lines both sides put around their block separate the two blocks too
    if head and all(not line.strip() for line in head):
        sep = head
    elif tail and all(not line.strip() for line in tail):
        sep = tail
    else:
        sep = []
    return [head + new + sep + mine + tail, head + mine + sep + new + tail]


def _same_modulo_style(rel: str, yours: bytes, base: bytes, style) -> bool:
    """The user's file is the base, reformatted (or with other line endings)."""
    if _lf(yours) == _lf(base):
        return True
    if not (style and rel.endswith(".py")):
        return False

    mine, old = textio.decode(yours, python=True), textio.decode(base, python=True)
    return mine is not None and old is not None and style.apply(old.text, rel) == mine.text


def _resolutions(yours: list[str], base: list[str], theirs: list[str]) -> list[list[str]]:
    """Ways to settle a conflict where neither side changed what the other changed, best first.

    - base empty: both sides only inserted lines at one place: keep both;
    - the user's lines are the base plus lines before or after it (the user only added next to
      what the change rewrote): the change's version, with the user's lines in their place.
    Anything else is a real conflict ([]).
    """
    if not base:
        return _both_inserted(yours, theirs)
    n = len(base)
    if len(yours) > n and yours[:n] == base:
        return [theirs + yours[n:]]
    if len(yours) > n and yours[-n:] == base:
        return [yours[:-n] + theirs]
    return []


def _compiles_text(text: str) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(text, "<merged>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


def merge_text(
    path: str,
    base: bytes,
    yours: bytes,
    theirs: bytes,
    *,
    git: str | None = None,
    style=None,
    gone=None,
) -> TextMerge:
    """Three-way merge of one text file, checked: the engine of add/remove feature (and upgrade).

    `base` and `theirs` are renders (UTF-8); `yours` is the user's file in its own encoding and line
    endings, which the result keeps. `style` (scaffold.style.Style) brings base and theirs into the
    user's formatting first; `gone` (scaffold.meaning.Gone) is what the change takes away, for the
    leftover check. Pure insertions by both sides at one place are kept both (the change's lines
    first) when the file still compiles. Raises CannotMerge when the file cannot be merged as text.
    """

    python = path.endswith(".py")
    mine = textio.decode(yours, python=python)
    old, new = textio.decode(base, python=python), textio.decode(theirs, python=python)
    if mine is None or old is None or new is None:
        raise CannotMerge(f"{path} is binary")
    base_text, theirs_text = old.text, new.text
    styled_kind = python or (path.endswith(".md") and style is not None and style.ruff_format)
    if style and styled_kind and mine.text not in (base_text, theirs_text):
        styled = style.apply(base_text, path)
        if similarity(styled, mine.text) > similarity(base_text, mine.text):
            base_text, theirs_text = styled, style.apply(theirs_text, path)
    result = TextMerge(path, None)
    if mine.text == base_text:
        merged = theirs_text
    elif mine.text == theirs_text or base_text == theirs_text:
        merged = mine.text
    else:
        raw, _ = merge_file(
            mine.text.encode(), base_text.encode(), theirs_text.encode(), git or find_git()
        )
        blocks = _conflict_blocks(raw.decode().splitlines(keepends=True))
        chosen: dict[int, list[str]] = {}
        line = 1
        for k, block in enumerate(blocks):
            if isinstance(block, str):
                line += 1
                continue
            y, b, t = block
            options = _resolutions(y, b, t)
            if options:  # both sides only inserted, or the user only added next to the change
                for option in options:
                    trial = {**chosen, k: option}  # other conflicts: yours, for the check
                    text = _join(blocks, lambda i, blk, trial=trial: trial.get(i, blk[0]))
                    if not python or _compiles_text(text):
                        chosen[k] = option
                        if b:
                            what = "you added lines next to lines the change rewrote; kept yours"
                        else:
                            order = (
                                "the change's lines first"
                                if option is options[0]
                                else "yours first, so that it compiles"
                            )
                            what = f"you and the change both added lines here; kept both ({order})"
                        result.auto_resolved.append(f"{path}:{line}: {what}")
                        break
            line += len(chosen.get(k, _marked(block)))
        merged = _join(blocks, lambda i, blk: chosen.get(i, _marked(blk)))
        result.markers = sum(
            1 for k, blk in enumerate(blocks) if not isinstance(blk, str) and k not in chosen
        )
    if python and not result.markers:
        result.leftovers = (
            meaning.find_leftovers(path, merged, gone, mine.text, base_text) if gone else []
        )
        flagged = {int(item.split(":")[1]) for item in result.leftovers}
        result.problems = meaning.introduced_problems(
            path, merged, mine.text, base_text, theirs_text, gone, skip_lines=flagged
        )
    try:
        result.data = textio.encode(merged, mine)
    except UnicodeEncodeError as exc:
        raise CannotMerge(
            f"{path} is {mine.encoding} text and the change adds "
            f"{exc.object[exc.start : exc.end]!r}, "
            f"which {mine.encoding} cannot store"
        ) from None
    return result


def _git_repo(project: Path, git: str) -> bool:
    proc = subprocess.run(
        [git, "-C", str(project), "rev-parse", "--is-inside-work-tree"],
        capture_output=True,
        text=True,
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
    entries = _git_lines(
        project, git, "status", "--porcelain=v1", "-z", "--untracked-files=no", "--", "."
    )
    names, skip = set(), False
    for entry in entries:
        if skip:  # the source path of a rename or copy
            skip = False
            continue
        names.add(entry[3:])
        skip = entry[:1] in ("R", "C")
    return sorted(names)


def _has_markers(data: bytes) -> bool:
    """Conflict markers of scaffold's merges or the user's own git merge (<<<<<<< HEAD)."""
    lines = data.splitlines()
    starts = [
        i for i, line in enumerate(lines) if line.startswith(b"<<<<<<< ") or line == b"<<<<<<<"
    ]
    if not starts:
        return False
    return any(line.startswith(b">>>>>>> ") or line == b">>>>>>>" for line in lines[starts[0] :])


def conflicted_files(project: Path, paths) -> list[str]:
    marked = []
    for rel in sorted(paths):
        path = project / rel
        if not path.is_file():
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if _has_markers(data):
            marked.append(rel)
    return marked


def refuse_unsafe(project: Path, record: Record, git: str, dry_run, allow_dirty) -> bool:
    """Refuse to merge over conflict markers, or (unless allowed) uncommitted changes to tracked
    files. Returns whether the project is in a git repository. Shared with `scaffold upgrade`."""
    marked = conflicted_files(project, record.generated)
    if marked:
        raise ScaffoldError(
            f"unresolved conflict markers (<<<<<<<) in {', '.join(marked)}: resolve them "
            "(keep the lines you want, delete the <<<<<<< ||||||| ======= >>>>>>> lines) "
            "and run again"
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
    return in_git


def write_result(
    project: Path, result: ChangeResult, record_files, generation: int, in_git, git, allow_dirty
) -> None:
    """Back up what git cannot give back, then write the changed files and the record as one
    transaction (refused if the record is no longer at `generation`). Shared with upgrade."""
    writes = {c.path: c.after for c in result.changes}
    existing = [p for p in writes if (project / p).is_file()]
    if existing and not in_git:
        keep = existing
    elif existing:
        tracked = _git_lines(project, git, "--literal-pathspecs", "ls-files", "-z", "--", *existing)
        # in a repository: what git cannot give back (untracked files, uncommitted changes)
        dirty = set(_dirty_files(project, git)) if allow_dirty else set()
        keep = sorted((set(existing) - set(tracked)) | (set(existing) & dirty))
    else:
        keep = []
    for rel in [*writes, *record_files]:  # a refusal (a link in the way) before any backup
        write._check_target(project, rel)
    if keep:
        result.backup = _backup(project, keep)
    try:
        # One transaction (scaffold.write.write_files): all of it or nothing, the record last;
        # refused if the record changed since it was read.
        commit(project, {**writes, **record_files}, generation)
    except ScaffoldError:
        if result.backup is not None:
            shutil.rmtree(result.backup, ignore_errors=True)
        raise
    except OSError as exc:
        raise ScaffoldError(
            f"writing the merged files failed ({exc.strerror or exc}); the next scaffold command "
            "in this project finishes or undoes a half-done write: fix the cause, then run "
            "'scaffold status'"
            + (f" (your previous files are in {result.backup})" if result.backup else "")
        ) from None
    result.written = True


@contextlib.contextmanager
def no_interrupts():
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler if previous is None else previous)


_ON_DISK = object()


def merge_one(
    project: Path,
    rel: str,
    base,
    theirs,
    git: str,
    result: ChangeResult,
    style=None,
    gone=None,
    yours=_ON_DISK,
) -> None:
    """`yours`: the user's file as `scaffold upgrade`'s migrations left it (default: on disk)."""
    if base == theirs:
        return  # the change does not touch this file: leave the user's version alone
    if yours is _ON_DISK:
        yours = read_file(project, rel)
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
        if _same_modulo_style(rel, yours, base, style):
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
    try:
        merged = merge_text(rel, base, yours, theirs, git=git, style=style, gone=gone)
    except CannotMerge as exc:
        if yours == base:
            result.changes.append(FileChange(rel, "updated", yours, theirs))
            return
        if yours == theirs:
            return
        raise ScaffoldError(
            f"cannot merge {rel}: {exc}, and both you and the change edited it; nothing was "
            "written: set your version aside (or make it text), run again, then put it back"
        ) from None
    result.auto_resolved += merged.auto_resolved
    result.problems += merged.problems
    result.leftovers += merged.leftovers
    if merged.data == yours:
        return
    result.changes.append(
        FileChange(
            rel,
            "merged" if _lf(yours) != _lf(base) else "updated",
            yours,
            merged.data,
            conflicts=merged.markers,
        )
    )
    if merged.markers:
        result.conflicts.append(
            f"{rel}: {merged.markers} conflict{'s' if merged.markers > 1 else ''} "
            f"(marked {MARKER} ... >>>>>>> theirs)"
        )


def project_style(project: Path, base_files: dict[str, bytes]):
    """The user's formatting (scaffold.style), or None when it is scaffold's own."""

    return detect(project, base_files)


def check_compiles(result: ChangeResult) -> None:
    for change in result.changes:
        if change.path.endswith(".py") and change.after is not None and not change.conflicts:
            try:
                with (
                    warnings.catch_warnings()
                ):  # e.g. an invalid escape: not this command's business
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


def _compiles(data: bytes | None) -> bool:
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
    backups = sorted((project / RECORD_DIR).glob("backup-*"), key=lambda p: p.stat().st_mtime_ns)
    for old in backups[:-KEEP_BACKUPS]:
        if old != folder and old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
    return folder


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def report_lists(result: ChangeResult, echo) -> None:
    """The changed files, the backup, and what the user must look at (shared with upgrade)."""
    for change in result.changes:
        extra = f" ({plural(change.conflicts, 'conflict')})" if change.conflicts else ""
        echo(f"  {change.action:<8} {change.path}{extra}")
    if result.backup is not None:
        echo(f"backup of the files about to change: {result.backup}")
    if result.auto_resolved:
        echo(f"merged automatically ({len(result.auto_resolved)}):")
        for line in result.auto_resolved:
            echo(f"  {line}")
    others = [c for c in result.conflicts if "(marked <<<<<<<" not in c]
    count = result.markers + len(others)
    if result.conflicts:
        echo(f"conflicts ({count}):")
        for line in result.conflicts:
            echo(f"  {line}")
    if result.problems:
        echo(f"names the merge leaves undefined ({len(result.problems)}):")
        for line in result.problems:
            echo(f"  {line}")
    if result.leftovers:
        echo(f"left over from the removed feature ({len(result.leftovers)}):")
        for line in result.leftovers:
            echo(f"  {line}")


def unified_diff(rel: str, before: bytes | None, after: bytes | None) -> str:
    a = [] if before is None else before.decode("utf-8", "replace").splitlines(keepends=True)
    b = [] if after is None else after.decode("utf-8", "replace").splitlines(keepends=True)
    lines = difflib.unified_diff(
        a,
        b,
        fromfile="/dev/null" if before is None else f"a/{rel}",
        tofile="/dev/null" if after is None else f"b/{rel}",
    )
    out = []
    for line in lines:
        out.append(line)
        if not line.endswith("\n"):
            out.append("\n\\ No newline at end of file\n")
    return "".join(out)


# --- status ----------------------------------------------------------------------------------

_SKIP_DIRS = {"__pycache__", "runs", "node_modules", "site-packages", "build", "dist"}


def user_python_files(project: Path, known) -> list[str]:
    found = []
    for root, dirs, files in os.walk(project):
        dirs[:] = sorted(
            d
            for d in dirs
            if not d.startswith(".")
            and d not in _SKIP_DIRS
            and not (Path(root) / d / "pyvenv.cfg").exists()
        )
        for name in sorted(files):
            if name.endswith(".py"):
                rel = (Path(root) / name).relative_to(project).as_posix()
                if rel not in known:
                    found.append(rel)
    return found
