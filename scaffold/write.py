"""Write files into place all or nothing: a new project by one rename, an existing one through a
journal that the next scaffold command finishes if a run is killed halfway.

`scaffold new PATH` (PATH does not exist yet) builds the project in a hidden staging directory
beside PATH, `.NAME.scaffold-partial-PID-XXXX`, and renames it into place: PATH either does not
exist or is complete. A staging directory left by a killed run (SIGKILL, power loss) is deleted
by the next `scaffold new` of the same name in that folder, once its process is gone.

Writing into an existing directory (an empty PATH, `new --force`, `add/remove feature`) is one
transaction: every file is first written under a staging folder of its own,
`.scaffold/staging-PID-XXXX/`, then the list of moves is written to `.scaffold/journal.json` (the
commit point), then the files are renamed into place. A run killed before the commit changed
nothing (the next scaffold command deletes the staging files); one killed after it is finished by
the next scaffold command in that project (`recover`, which every command runs once, before it
reads anything, and only under the project's exclusive lock: see `scaffold.lock`). Ctrl-C while
files are being written waits until they all are.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path

from scaffold.errors import ScaffoldError
from scaffold.paths import RECORD_DIR, check_relpath

STAGING_PREFIX = "scaffold-partial"
JOURNAL_FILE = f"{RECORD_DIR}/journal.json"
STAGING_DIR = f"{RECORD_DIR}/staging"  # each write stages in STAGING_DIR-PID-XXXX
# a staged file in a journal: STAGING_DIR-PID-XXXX/N (or N in STAGING_DIR, as written before)
_STAGED = re.compile(rf"({re.escape(STAGING_DIR)}-[0-9]+-[A-Za-z0-9_]+/)?[0-9]+")


def check_destination(dest: Path, force: bool = False) -> None:
    """Refuse a destination for `scaffold new` before anything is rendered or written.

    Run `recover(dest)` first when `dest` is a directory: an interrupted write into it is
    finished or undone before its contents are judged.
    """
    dest = Path(dest)
    if dest.is_symlink():
        raise ScaffoldError(
            f"{dest} is a symbolic link: give the directory it points to, or another path"
        )
    if dest.exists() and not dest.is_dir():
        raise ScaffoldError(f"{dest} exists and is not a directory: choose another path")
    if dest.is_dir():
        if any(dest.iterdir()) and not force:
            raise ScaffoldError(
                f"{dest} exists and is not empty: choose another path, or pass --force "
                "to write the generated files into it"
            )
    elif not dest.parent.is_dir():
        raise ScaffoldError(f"{dest.parent} is not an existing directory: create it first")


def write_new_project(dest: Path, files: dict[str, bytes], force: bool = False) -> None:
    """Write a freshly rendered project: all of it, or (after a failure or a kill) nothing."""
    dest = Path(dest)
    check_destination(dest, force)
    if dest.is_dir():  # empty, or --force: one transaction into it
        write_files(dest, files)
        return
    parent = dest.parent
    _remove_stale_staging(parent, dest.name)
    with _interrupts_deferred():
        staging = Path(
            tempfile.mkdtemp(prefix=f".{dest.name}.{STAGING_PREFIX}-{os.getpid()}-", dir=parent)
        )
        try:
            umask = os.umask(0)
            os.umask(umask)
            staging.chmod(0o777 & ~umask)
            for rel, data in files.items():
                target = staging / check_relpath(rel)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
                _copy_mode(rel, target)
            try:
                os.replace(staging, dest)  # the commit point
            except OSError:
                if dest.exists():
                    raise ScaffoldError(
                        f"{dest} was created by something else meanwhile: choose another path"
                    ) from None
                raise
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise


def _remove_stale_staging(parent: Path, name: str) -> None:
    """Delete staging directories of `scaffold new NAME` runs that were killed."""
    prefix = f".{name}.{STAGING_PREFIX}-"
    try:
        entries = list(Path(parent).iterdir())
    except OSError:
        return
    for entry in entries:
        if not entry.name.startswith(prefix) or entry.is_symlink() or not entry.is_dir():
            continue
        pid = entry.name[len(prefix) :].split("-", 1)[0]
        if pid.isdigit() and not _process_alive(int(pid)):
            shutil.rmtree(entry, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. another user's process
        return True
    return True


@contextmanager
def _interrupts_deferred():
    """Hold Ctrl-C (SIGINT) while files are written: the write completes, then the command does."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, lambda signum, frame: None)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)


def write_files(root: Path, files: dict[str, bytes | None]) -> None:
    """Write (or, for None, delete) files under `root`, all or nothing (see the notes above).

    The caller has run `recover(root)` already (once per command).
    """
    root = Path(root)
    for rel in files:
        _check_target(root, check_relpath(rel))
    _check_target(root, JOURNAL_FILE)
    ops = []
    with _interrupts_deferred():
        (root / RECORD_DIR).mkdir(exist_ok=True)
        staging = Path(
            tempfile.mkdtemp(
                prefix=f"{Path(STAGING_DIR).name}-{os.getpid()}-", dir=root / RECORD_DIR
            )
        )
        try:
            for number, (rel, data) in enumerate(files.items()):
                if data is None:
                    ops.append([rel, None])
                    continue
                tmp = staging / str(number)
                tmp.write_bytes(data)
                if (root / rel).is_file():
                    shutil.copymode(root / rel, tmp)  # keep the user's permissions
                _copy_mode(rel, tmp)
                # (mkdtemp gives an absolute path from Python 3.12 on, whatever `root` is)
                ops.append([rel, Path(os.path.relpath(tmp, root)).as_posix()])
            part = staging / "journal.part"
            part.write_text(json.dumps({"format": 1, "ops": ops}), encoding="utf-8")
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        os.replace(part, root / JOURNAL_FILE)  # the commit point
        _apply_journal(root, ops)
        shutil.rmtree(staging, ignore_errors=True)


def _staging_dirs(root: Path) -> list[Path]:
    """Every staging folder in the project (of this command, of others, of killed ones)."""
    prefix = Path(STAGING_DIR).name
    try:
        entries = list((root / RECORD_DIR).iterdir())
    except OSError:
        return []
    return [
        e
        for e in entries
        if (e.name == prefix or e.name.startswith(prefix + "-"))
        and e.is_dir()
        and not e.is_symlink()
    ]


def pending_write(root: Path) -> bool:
    """True if an interrupted write waits to be finished or undone (see `recover`)."""
    root = Path(root)
    return (root / JOURNAL_FILE).is_file() or bool(_staging_dirs(root))


def recover(root: Path) -> str:
    """Finish a write interrupted after its commit point, or undo one interrupted before it.

    Every scaffold command that works in an existing project calls this once, first, holding
    the project's exclusive lock: every staging folder it finds then belongs to a dead command.
    Returns "finished", "undone" or "" (nothing was pending).
    """
    root = Path(root)
    journal = root / JOURNAL_FILE
    if journal.is_file() and not journal.is_symlink():
        ops = _read_journal(root, journal)
        with _interrupts_deferred():
            _apply_journal(root, ops)
            for staging in _staging_dirs(root):
                shutil.rmtree(staging, ignore_errors=True)
        return "finished"
    stale = _staging_dirs(root)
    if stale:
        for staging in stale:
            shutil.rmtree(staging, ignore_errors=True)
        try:
            (root / RECORD_DIR).rmdir()  # only if empty: a `new` into an empty directory
        except OSError:
            pass
        return "undone"
    return ""


def _read_journal(root: Path, journal: Path) -> list:
    try:
        data = json.loads(journal.read_text(encoding="utf-8"))
        if data.get("format") != 1:
            raise ValueError("unknown format")
        ops = [(rel, name) for rel, name in data["ops"]]
        for rel, name in ops:
            _check_target(root, check_relpath(rel))
            if name is not None and not (isinstance(name, str) and _STAGED.fullmatch(name)):
                raise ValueError("bad entry")
    except (
        OSError,
        ValueError,
        TypeError,
        KeyError,
        AttributeError,
        RecursionError,
        ScaffoldError,
    ):
        raise ScaffoldError(
            f"{journal} is damaged, so an interrupted scaffold write cannot be finished: "
            f"delete {JOURNAL_FILE} and the {STAGING_DIR}* folders, then check your files "
            "(git status)"
        ) from None
    return ops


def _apply_journal(root: Path, ops) -> None:
    for rel, staged in ops:
        target = root / rel
        if staged is None:
            if target.is_symlink() or target.is_file():
                target.unlink()
        else:
            source = root / staged if "/" in staged else root / STAGING_DIR / staged  # older
            if source.exists():  # else: moved already, before an interruption
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(source, target)
    (root / JOURNAL_FILE).unlink()


def _check_target(root: Path, rel: str) -> None:
    """Refuse to write through a symbolic link, or where a directory or file is in the way."""
    parts = rel.split("/")
    for depth in range(1, len(parts) + 1):
        path = root.joinpath(*parts[:depth])
        if path.is_symlink():
            raise ScaffoldError(
                f"refusing to write {rel}: {path} is a symbolic link; scaffold does not write "
                "through links: replace it with a regular file or directory"
            )
        last = depth == len(parts)
        if path.exists() and (path.is_dir() if last else not path.is_dir()):
            what = "a directory" if last else "a file"
            raise ScaffoldError(f"cannot write {rel}: {path} is {what}; move it away and run again")


def _copy_mode(rel: str, path: Path) -> None:
    if rel.endswith(".sh"):
        path.chmod(0o755)
