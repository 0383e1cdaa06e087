"""One scaffold command at a time per project: an OS file lock on the project's `.scaffold/`.

A command that writes (add, remove, the recovery of an interrupted write) holds an exclusive
`flock` on the `.scaffold` folder for its whole run; a read-only one (status, diff, a dry run)
holds a shared one, so it never sees a half-written record. The operating system releases the
lock when the process ends in any way, so a `kill -9` never leaves a stale lock behind. While it
holds the lock exclusively, a command names itself in `.scaffold/lock-holder.json`, so a second
command that has waited long enough can say who holds the project.

An interrupted write is finished (or undone) only under the exclusive lock, so recovery never
touches the staging of a live command. The record carries a generation number: a command commits
only if the record is still at the generation it read (defence in depth, for instance against a
`.scaffold/` restored from a backup while a command runs).
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from scaffold.errors import ScaffoldError
from scaffold.paths import RECORD_DIR
from scaffold.record import RECORD_FILE, read_generation, with_generation
from scaffold.write import pending_write, recover, write_files

HOLDER_NAME = "lock-holder.json"
HOLDER_FILE = f"{RECORD_DIR}/{HOLDER_NAME}"
WRITE_WAIT = 10.0  # seconds a writer waits for the project before it refuses
READ_WAIT = 60.0  # a read-only command waits longer: it only has to see a consistent state
_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.EBADF}


@contextmanager
def project_lock(
    root: Path,
    *,
    write: bool,
    command: str,
    wait: float | None = None,
    echo: Callable[[str], None] | None = None,
) -> Iterator[None]:
    """Hold the project for `command`: exclusively if it writes, shared if it only reads.

    An interrupted earlier write is finished first, under the exclusive lock (a reader takes the
    exclusive lock for that, then keeps it). A project without `.scaffold/` has nothing to lock:
    the record check that follows refuses it.
    """
    root = Path(root)
    folder = root / RECORD_DIR
    if not folder.is_dir():
        yield
        return
    waiting = _Waiting(root, (WRITE_WAIT if write else READ_WAIT) if wait is None else wait, echo)
    fd = _open_folder(folder)
    holding = False
    try:
        exclusive = write or pending_write(root)
        _take(fd, root, exclusive, waiting)
        # A writer died just before we got the lock (its holder file, at least, is left).
        if not exclusive and (pending_write(root) or (root / HOLDER_FILE).exists()):
            exclusive = True
            _take(fd, root, exclusive, waiting)
        if exclusive:
            _name_holder(root, command)  # first, so that a command that waits can say who
            holding = True
            state = recover(root)
            if state == "undone" and [p.name for p in folder.iterdir()] == [HOLDER_NAME]:
                # an undone `new` into an empty folder: leave the folder as empty as it was
                os.unlink(folder / HOLDER_NAME)
                folder.rmdir()
                holding = False
            if state == "finished" and echo is not None:
                echo(
                    "note: finished an earlier scaffold write in this project that was interrupted"
                )
        yield
    finally:
        if holding:
            try:
                (root / HOLDER_FILE).unlink()
            except OSError:
                pass
        os.close(fd)  # releases the lock


def _open_folder(folder: Path) -> int:
    try:
        return os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise ScaffoldError(f"cannot read {folder}: {exc.strerror or exc}") from None


class _Waiting:
    """How long a command may still wait for the project, and whether it has said so."""

    def __init__(self, root: Path, limit: float, echo) -> None:
        self.root, self.limit, self.echo = root, max(0.0, limit), echo
        self.deadline = time.monotonic() + self.limit
        self.named_by = time.monotonic() + min(0.5, self.limit)
        self.told = False


def _take(fd: int, root: Path, exclusive: bool, waiting: _Waiting) -> None:
    """Lock `fd` (the `.scaffold` folder) through a gate, the project folder itself, held only
    while taking the lock: a writer that waits for readers to finish holds the gate, so readers
    that come after it queue behind it instead of starving it."""
    gate = _open_folder(root)
    try:
        _acquire(gate, True, waiting)
        _acquire(fd, exclusive, waiting)
    finally:
        os.close(gate)


def _acquire(fd: int, exclusive: bool, waiting: _Waiting) -> None:
    mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
    root = waiting.root
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        except OSError as exc:
            if exc.errno in _NO_LOCKS:
                raise ScaffoldError(
                    f"{root} is on a file system without file locks ({exc.strerror or exc}), so "
                    "scaffold cannot keep two commands from writing it at once: run scaffold on "
                    "a copy of the project on a local disk"
                ) from None
            raise
        holder, doing = _holder(root)
        if doing == "reading" and not waiting.told and time.monotonic() < waiting.named_by:
            time.sleep(0.05)  # a writer that has just taken the lock names itself at once
            continue
        if time.monotonic() >= waiting.deadline:
            raise ScaffoldError(
                f"{root} is busy: {holder} is {doing} it; wait until it finishes and run again, "
                "or pass --wait SECONDS to wait longer"
            )
        if not waiting.told and waiting.echo is not None:
            waiting.echo(f"waiting for {holder} to finish (at most {waiting.limit:g} s)")
            waiting.told = True
        time.sleep(0.05)


def _name_holder(root: Path, command: str) -> None:
    since = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    info = {"pid": os.getpid(), "command": command, "since": since}
    try:  # one small write: a reader sees all of it or (rarely) nothing it can parse
        fd = os.open(root / HOLDER_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, json.dumps(info).encode())
        finally:
            os.close(fd)
    except OSError:
        pass  # only the message of a waiting command is poorer


def _holder(root: Path) -> tuple[str, str]:
    """Who holds the project and what it does, from the holder file if its process is alive."""
    try:
        info = json.loads((root / HOLDER_FILE).read_text(encoding="utf-8"))
        pid, command, since = int(info["pid"]), str(info["command"]), str(info["since"])
        os.kill(pid, 0)
    except PermissionError:
        pass  # alive, another user's process
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return "another scaffold command (status, diff or a dry run)", "reading"
    return f"'scaffold {command[:80]}' (pid {pid}, since {since[:40]})", "changing"


def commit(root: Path, files: dict[str, bytes | None], generation: int) -> None:
    """Write `files` (with the record, as one transaction) if the record is still at
    `generation`; the new record gets the next generation."""
    root = Path(root)
    now = read_generation(root)
    if now != generation:
        raise ScaffoldError(
            f"{root / RECORD_FILE} changed while this command ran (generation {generation}, "
            f"now {now}): nothing was written; run the command again"
        )
    write_files(root, with_generation(files, generation + 1))
