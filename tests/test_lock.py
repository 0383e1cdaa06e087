"""One scaffold command at a time per project (scaffold/lock.py): concurrent writers end in a
consistent state, a killed lock holder leaves no stale lock, readers never see a half-done write,
and a record that changed under a running command is never overwritten."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import REPO, render_project
from scaffold.answers import Answers
from scaffold.errors import ScaffoldError
from scaffold.lock import HOLDER_FILE
from scaffold.merge import change_feature, project_status
from scaffold.paths import in_record_dir
from scaffold.record import PRISTINE_FILE, RECORD_FILE, load_record
from scaffold.render import render
from scaffold.write import JOURNAL_FILE

NAME = "locked"
# The real CLI, started with its modules imported, held at a barrier until the test lets every
# process go at once; SCAFFOLD_TEST_SLOW_WRITES makes each rename out of a staging folder (the
# steps of a project write, not of the render caches) take that long.
CLI = """
import os, sys, time
import scaffold.cli
delay = float(os.environ.get("SCAFFOLD_TEST_SLOW_WRITES", "0"))
if delay:
    real_replace = os.replace
    def slow_replace(*args, **kwargs):
        if "/.scaffold/staging" in str(args[0]):
            time.sleep(delay)
        return real_replace(*args, **kwargs)
    os.replace = slow_replace
go = sys.argv[1]
while not os.path.exists(go):
    time.sleep(0.005)
sys.argv = ["scaffold", *sys.argv[2:]]
scaffold.cli.main()
"""
_RENDERS: dict = {}


def expected(features) -> dict[str, bytes]:
    """A fresh render's own files for these features (what an unedited project must hold)."""
    key = tuple(features)
    if key not in _RENDERS:
        files = render(Answers(project_name=NAME, features=key))
        _RENDERS[key] = {p: d for p, d in files.items() if not in_record_dir(p)}
    return _RENDERS[key]


def start(tmp_path: Path, go: Path, *args: str, slow: float = 0.0) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "SCAFFOLD_TEST_SLOW_WRITES": str(slow)}
    return subprocess.Popen(
        [sys.executable, "-c", CLI, str(go), *args], cwd=tmp_path, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out + err


def assert_consistent(project: Path, features, generation: int) -> None:
    """Record, pristine copy and files all say: a clean render of `features`."""
    record = load_record(project)
    assert list(record.answers.features) == list(features)
    assert record.generation == generation
    want = expected(features)
    assert {p: d for p, d in record.pristine.items()} == want
    on_disk = {p: (project / p).read_bytes() for p in record.generated if (project / p).exists()}
    assert on_disk == want
    leftovers = [p.name for p in (project / ".scaffold").iterdir()
                 if not p.name.startswith("backup-")]
    assert sorted(leftovers) == ["pristine.json", "record.json"], leftovers


@pytest.mark.slow
@pytest.mark.parametrize(
    "before, first, second",
    [
        ((), ("add", "amp"), ("add", "resume")),
        (("amp",), ("remove", "amp"), ("add", "resume")),
    ],
)
def test_two_writers_started_together_end_consistent(tmp_path, before, first, second):
    """Two trials each: both commands succeed one after the other (the second waited), or the
    second refuses after its wait; never a mix."""
    for trial in range(2):
        project = render_project(tmp_path / f"p{trial}", features=before, name=NAME)
        go = tmp_path / f"go{trial}"
        procs = [start(tmp_path, go, verb, "feature", feature, "-p", str(project))
                 for verb, feature in (first, second)]
        time.sleep(1.0)  # both imported and at the barrier (the import takes ~0.2 s)
        go.touch()
        (code1, out1), (code2, out2) = finish(procs[0]), finish(procs[1])
        outputs = out1 + out2
        assert "Traceback" not in outputs, outputs
        assert "waiting for 'scaffold" in outputs or "is busy" in outputs, outputs
        applied = set(before)
        results = {first: code1, second: code2}
        succeeded = [change for change, code in results.items() if code == 0]
        for code, out in ((code1, out1), (code2, out2)):
            assert code == 0 or "is busy" in out, out
        assert succeeded, outputs
        for verb, feature in succeeded:
            applied = applied | {feature} if verb == "add" else applied - {feature}
        order = ["amp", "resume"]
        assert_consistent(project, [f for f in order if f in applied], generation=len(succeeded))


@pytest.mark.slow
def test_a_killed_lock_holder_leaves_no_lock_and_its_write_is_finished(tmp_path):
    project = render_project(tmp_path / "p", name=NAME)
    go = tmp_path / "go"
    go.touch()
    proc = start(tmp_path, go, "add", "feature", "amp", "-p", str(project), slow=0.3)
    deadline = time.time() + 120
    while not (project / JOURNAL_FILE).exists():  # past the commit point, renaming slowly
        assert proc.poll() is None and time.time() < deadline, finish(proc)
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (project / JOURNAL_FILE).exists() and (project / HOLDER_FILE).exists()
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "scaffold", "add", "feature", "resume", "-p", str(project),
         "--wait", "0"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "finished an earlier scaffold write" in result.stdout
    assert "waiting" not in result.stdout + result.stderr
    assert time.monotonic() - started < 60
    assert_consistent(project, ["amp", "resume"], generation=2)  # the killed add was committed


def test_status_polled_during_an_add_waits_and_agrees_with_the_files(tmp_path):
    """A read-only command started during a (slow) write never deletes its staging, never errors,
    and never reports a record that disagrees with the files."""
    project = render_project(tmp_path / "p", name=NAME)
    go = tmp_path / "go"
    go.touch()
    proc = start(tmp_path, go, "add", "feature", "amp", "-p", str(project), slow=0.15)
    seen, waited = [], []
    deadline = time.time() + 120
    while proc.poll() is None and time.time() < deadline:
        lines = project_status(project, echo=waited.append)
        seen.append((lines[3], lines[4]))
        # back to back: a waiting writer holds the gate, so readers cannot starve it
    code, out = finish(proc)
    assert code == 0, out
    assert waited, "no status call ran while the add held the project"
    assert set(seen) <= {
        ("features: none", "files: all generated files as rendered; no Python files added"),
        ("features: amp", "files: all generated files as rendered; no Python files added"),
    }, seen
    assert_consistent(project, ["amp"], generation=1)


def test_a_record_changed_under_a_running_command_is_not_overwritten(tmp_path, monkeypatch):
    """E.g. `.scaffold/` restored from a backup while `add` renders: the add refuses to commit."""
    project = render_project(tmp_path / "p", name=NAME)
    change_feature(project, "resume", add=True, echo=lambda line: None)
    backup = {p: (project / p).read_bytes() for p in (RECORD_FILE, PRISTINE_FILE)}
    change_feature(project, "resume", add=False, echo=lambda line: None)  # generation 2
    real_render = render

    def render_then_restore(answers):
        files = real_render(answers)
        for rel, data in backup.items():  # the user restores the backup (generation 1)
            (project / rel).write_bytes(data)
        return files

    monkeypatch.setattr("scaffold.merge.render", render_then_restore)
    with pytest.raises(ScaffoldError, match=r"changed while this command ran \(generation 2, now 1\)"):
        change_feature(project, "amp", add=True, echo=lambda line: None)
    assert b"[amp]" not in (project / "train.py").read_bytes()
    assert not (project / JOURNAL_FILE).exists()


def test_a_file_system_without_locks_is_one_clear_refusal(tmp_path, monkeypatch):
    project = render_project(tmp_path / "p", name=NAME)

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr("scaffold.lock.fcntl.flock", no_locks)
    with pytest.raises(ScaffoldError, match="file system without file locks"):
        project_status(project)


def test_a_second_writer_names_the_holder_then_refuses(tmp_path):
    """In-process holder (a thread of this test), real second command: one line, exit 1."""
    from scaffold.lock import project_lock

    project = render_project(tmp_path / "p", name=NAME)
    held, release = threading.Event(), threading.Event()

    def hold():
        with project_lock(project, write=True, command="add feature amp"):
            held.set()
            release.wait(60)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        held.wait(30)
        result = subprocess.run(
            [sys.executable, "-m", "scaffold", "remove", "feature", "amp", "-p", str(project),
             "--wait", "0.5"],
            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
            timeout=120,
        )
        info = json.loads((project / HOLDER_FILE).read_text())
    finally:
        release.set()
        holder.join()
    assert result.returncode == 2  # refused, nothing written
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        f"error: {project} is busy: 'scaffold add feature amp' (pid {os.getpid()}, since "
        f"{info['since']}) is changing it; wait until it finishes and run again, or pass "
        "--wait SECONDS to wait longer"
    ], result.stderr
    assert not (project / HOLDER_FILE).exists()  # released, and the holder's name with it


def test_a_writer_that_has_just_taken_the_lock_is_named_not_called_a_reader(tmp_path):
    """The holder file is written just after the lock is taken: a command that finds the lock
    held in that moment names the writer once it has named itself (CI once saw 'status, diff or
    a dry run' for a writer caught in that moment)."""
    import fcntl

    from scaffold.lock import _name_holder, project_lock

    project = render_project(tmp_path / "p", name=NAME)
    locked, release = threading.Event(), threading.Event()

    def writer_taking_the_lock():
        fd = os.open(project / ".scaffold", os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            locked.set()
            time.sleep(0.2)  # the moment between the lock and the holder file, drawn out
            _name_holder(project, "add feature amp")
            release.wait(60)
        finally:
            os.close(fd)

    thread = threading.Thread(target=writer_taking_the_lock)
    thread.start()
    said = []
    try:
        locked.wait(30)
        with pytest.raises(ScaffoldError, match="is busy: 'scaffold add feature amp'"):
            with project_lock(project, write=True, command="add feature resume", wait=1.0,
                              echo=said.append):
                pass
    finally:
        release.set()
        thread.join()
    assert said == [f"waiting for 'scaffold add feature amp' (pid {os.getpid()}, since "
                    f"{json.loads((project / HOLDER_FILE).read_text())['since']}) to finish "
                    "(at most 1 s)"], said


def test_a_waiting_writer_is_not_starved_by_readers_that_come_after_it(tmp_path):
    """Reader 1 holds the project; a writer waits for it; a reader that comes later queues behind
    the writer (it may not slip in, or back-to-back readers could keep a writer out forever)."""
    from scaffold.lock import project_lock

    project = render_project(tmp_path / "p", name=NAME)
    reading, release, writer_waits, written = (threading.Event() for _ in range(4))

    def reader():
        with project_lock(project, write=False, command="status"):
            reading.set()
            release.wait(60)

    def writer():
        with project_lock(project, write=True, command="add feature amp", wait=60,
                          echo=lambda line: writer_waits.set()):
            written.set()

    threads = [threading.Thread(target=reader), threading.Thread(target=writer)]
    threads[0].start()
    reading.wait(30)
    threads[1].start()
    try:
        assert writer_waits.wait(30)
        with pytest.raises(ScaffoldError, match="is busy"):
            with project_lock(project, write=False, command="status", wait=0.3):
                pass
        assert not written.is_set()
    finally:
        release.set()
        for thread in threads:
            thread.join(60)
    assert written.is_set()
