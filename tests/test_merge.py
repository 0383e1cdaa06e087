"""`scaffold add/remove feature`, `diff feature`, `status`: features merged into edited projects.

Real git, real files. Renders are memoised per answers within this file (the renderer is
deterministic for given answers and templates), so the 24-project test pays for each distinct
render once and the later tests reuse them.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import TINY, commit_all, git, render_project, run_jobs, scaffold_cli
from scaffold.catalogue import FEATURES, TASKS
from scaffold.errors import ScaffoldError, UsageError

NAME = "proj"  # one project name everywhere, so that renders are shared between tests
_RENDERS: dict = {}


@pytest.fixture(autouse=True)
def memo_render(monkeypatch):
    import scaffold.render as render_mod

    real = render_mod.render

    def render(answers, templates=None):
        key = (answers.project_name, answers.task, tuple(sorted(answers.features)),
               answers.description, render_mod.template_fingerprint(templates), str(templates))
        if key not in _RENDERS:
            _RENDERS[key] = real(answers, templates)
        return dict(_RENDERS[key])

    monkeypatch.setattr(render_mod, "render", render)
    monkeypatch.setattr("scaffold.merge.render", render)


def fresh(task="image-classification", features=()) -> dict[str, bytes]:
    """A render's own files (no .scaffold/)."""
    from scaffold.answers import Answers
    from scaffold.render import render

    files = render(Answers(NAME, task, list(features)))
    return {p: d for p, d in files.items() if not p.startswith(".scaffold/")}


def make_project(path: Path, task="image-classification", features=(), in_git=True) -> Path:
    render_project(path, task, features, name=NAME)
    if in_git:
        git(path, "-c", "init.defaultBranch=main", "init", "-q")
        commit_all(path, "generated")
    return path


def snapshot(root: Path, include_record=False) -> dict[str, bytes]:
    files = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and not rel.startswith(".git/") and (
            include_record or not rel.startswith(".scaffold/")
        ):
            files[rel] = path.read_bytes()
    return files


def change(project, name, add=True, **kwargs):
    from scaffold.merge import change_feature

    lines = []
    result = change_feature(Path(project), name, add=add, echo=lines.append, **kwargs)
    return result, lines


def features_of(project) -> list[str]:
    return json.loads((project / ".scaffold" / "record.json").read_text())["answers"]["features"]


def resolve(text: str, side: str) -> str:
    """Resolve every diff3 conflict in `text` by taking one side."""
    pattern = re.compile(
        r"^<<<<<<< yours\n(.*?)^\|\|\|\|\|\|\| base\n(.*?)^=======\n(.*?)^>>>>>>> theirs\n",
        re.S | re.M,
    )
    index = {"yours": 1, "base": 2, "theirs": 3}[side]
    return pattern.sub(lambda m: m.group(index), text)


# --- scripted user edits -----------------------------------------------------------------------

# (file, old, new): `old` (a string or a regex) must match exactly `count` times ("all": >= 1)
EDITS = [
    # rename a variable in the model
    ("model.py", "self.head", "self.classifier", "all"),
    # change a config default (the most common edit of all)
    ("train.py", re.compile(r"    epochs: int = \d+  #"), "    epochs: int = 3  #", 1),
    # a new metric inside the loop (of the update's last batch), and its metrics.csv column
    ("train.py", '    "train_loss",\n', '    "train_loss",\n    "last_batch",\n', 1),
    ("train.py", '                row = {"step": step, "epoch": epoch + 1, "lr": lr}\n',
     '                row = {"step": step, "epoch": epoch + 1, "lr": lr}\n'
     '                row["last_batch"] = batch_size(batch)  # my metric\n', 1),
    # a line next to a feature's insertion point (ddp rewrites the lines just around it), not on it
    ("train.py", "    torch.manual_seed(cfg.seed)\n",
     "    torch.manual_seed(cfg.seed)\n    torch.backends.cudnn.benchmark = True  # my speed-up\n", 1),
    # reformat one function: parse_config's calls joined as a 120-column formatter would
    ("train.py", re.compile(
        r"            parser\.add_argument\(\n                flag\(field\.name\),\n"
        r"                action=argparse\.BooleanOptionalAction,\n"
        r"                default=field\.default,\n                help=text,\n            \)\n"),
     "            parser.add_argument(flag(field.name), action=argparse.BooleanOptionalAction, "
     "default=field.default, help=text)\n", 1),
    ("train.py", re.compile(
        r"            parser\.add_argument\(\n                flag\(field\.name\),\n"
        r"                type=type\(field\.default\),\n"
        r"                default=field\.default,\n"
        r"                metavar=type\(field\.default\)\.__name__\.upper\(\),\n"
        r"                help=text,\n            \)\n"),
     "            parser.add_argument(flag(field.name), type=type(field.default), "
     "default=field.default,\n"
     "                                metavar=type(field.default).__name__.upper(), help=text)\n", 1),
]
NEW_FILE = ("augment.py", b'"""My own augmentation."""\n\n\ndef flip(images):\n    return images.flip(-1)\n')
DELETED = ".gitignore"  # a generated file no feature changes


def edit_files(files: dict[str, bytes]) -> dict[str, bytes]:
    """The scripted edits applied to {path: bytes}; each must match as EDITS says."""
    files = dict(files)
    for rel, old, new, count in EDITS:
        text = files[rel].decode()
        if isinstance(old, re.Pattern):
            text, n = old.subn(lambda m: new, text)
        else:
            n = text.count(old)
            text = text.replace(old, new)
        assert n >= 1 and (count == "all" or n == count), (rel, old, n)
        files[rel] = text.encode()
    files[NEW_FILE[0]] = NEW_FILE[1]
    del files[DELETED]
    return files


def write_edits(project: Path) -> None:
    before = snapshot(project)
    after = edit_files(before)
    for rel in before.keys() - after.keys():
        (project / rel).unlink()
    for rel, data in after.items():
        if before.get(rel) != data:
            (project / rel).write_bytes(data)


# --- every feature on every task ----------------------------------------------------------------


@pytest.mark.slow
def test_every_feature_merges_into_edited_projects_of_every_task(tmp_path, monkeypatch):
    """Scripted edits, then `add feature X` for each X and task: the result equals the fresh
    render with X plus the same edits (so every edit and every feature line is there), no
    conflict, it compiles, passes ruff F, and every merged project trains a few steps."""
    started = time.perf_counter()
    repo = tmp_path / "repo"  # one repository holding the 24 projects (a monorepo)
    repo.mkdir()
    git(repo, "-c", "init.defaultBranch=main", "init", "-q")
    projects = {}
    for task in TASKS:
        edited = tmp_path / f"edited-{task}"
        make_project(edited, task, in_git=False)
        write_edits(edited)
        # pretrained replaces the from-scratch model that EDITS edits (self.head): adding it
        # there is a conflict by design; it also needs a model to download
        for feature in (f for f in FEATURES if f != "pretrained"):
            projects[task, feature] = shutil.copytree(edited, repo / f"{task}-{feature}")
    commit_all(repo, "generated and edited")

    phase = time.perf_counter()
    print(f"\n24 projects: render 3 + copy + git: {phase - started:.1f} s")
    timings = []
    for (task, feature), project in projects.items():
        before = snapshot(project)
        start = time.perf_counter()
        result, lines = change(project, feature)
        timings.append(time.perf_counter() - start)
        assert result.conflicts == [] and result.written, (task, feature, lines)
        expected = edit_files(fresh(task, [feature]))
        after = snapshot(project)
        assert after == expected, (task, feature, sorted(
            p for p in after.keys() | expected.keys() if after.get(p) != expected.get(p)))
        # export adds files (export.py, its test) and no train.py lines
        assert any(f"[{feature}]".encode() in data for data in after.values()), feature
        assert after[NEW_FILE[0]] == before[NEW_FILE[0]] and DELETED not in after
        assert features_of(project) == [feature]
        for rel, data in after.items():
            if rel.endswith(".py"):
                compile(data, rel, "exec")
    print(f"24 x add feature in-process: {sum(timings):.1f} s (mean {sum(timings) / 24:.2f} s, "
          f"max {max(timings):.2f} s)")
    phase = time.perf_counter()

    ruff = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--isolated", "--select", "F,E9",
         *map(str, projects.values())], capture_output=True, text=True,
    )
    assert ruff.returncode == 0, ruff.stdout + ruff.stderr

    jobs = []
    for (task, feature), project in projects.items():
        args = [*TINY, "--synthetic-train-size", "32", "--synthetic-val-size", "16",
                "--epochs", "1", "--max-steps", "2", "--device", "cpu",
                "--out-dir", str(tmp_path / "runs" / f"{task}-{feature}")]
        if feature == "compile":
            args.append("--no-compile")  # inductor on a loaded CPU costs minutes; eager is enough
        jobs.append({"project": str(project), "args": args})
    print(f"ruff on 24 projects: {time.perf_counter() - phase:.1f} s")
    phase = time.perf_counter()
    # the trackers log offline and into this test's folder
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlruns.db'}")
    results = run_jobs(jobs, tmp_path)
    print(f"24 training runs (one process): {time.perf_counter() - phase:.1f} s")
    for job, res in zip(jobs, results):
        assert res["ok"], (job["project"], res["error"][-2000:], res["stdout"][-1000:])
        with open(Path(job["args"][job["args"].index("--out-dir") + 1]) / "metrics.csv") as f:
            rows = list(csv.DictReader(f))
        assert "last_batch" in rows[0] and rows[0]["last_batch"] != "", job["project"]  # my metric


# --- conflicts, through the real CLI -----------------------------------------------------------


@pytest.mark.slow
def test_cli_edit_on_the_feature_lines_is_a_conflict(tmp_path):
    project = make_project(tmp_path / "p")
    train = project / "train.py"
    plain = train.read_text()
    old = "                loss_sum, count = compute_loss(model, batch, loss_args)\n"
    mine = "                loss_sum, count = compute_loss(model, batch, loss_args)  # my forward\n"
    assert plain.count(old) == 1  # amp moves exactly this line under `with autocast:`
    train.write_text(plain.replace(old, mine))
    commit_all(project)
    before = snapshot(project)

    start = time.perf_counter()
    out = scaffold_cli("add", "feature", "amp", "--project", str(project))
    print(f"scaffold add feature amp (CLI, with a conflict): {time.perf_counter() - start:.2f} s")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "  merged   train.py (1 conflict)" in out.stdout.splitlines()
    assert "conflicts (1):" in out.stdout
    assert any(line.startswith("  train.py: 1 conflict") for line in out.stdout.splitlines())

    merged = train.read_text()
    amp_train = fresh(features=["amp"])["train.py"].decode()
    assert merged.count("<<<<<<< yours\n") == 1
    yours = merged.split("<<<<<<< yours\n")[1].split("||||||| base\n")[0]
    theirs = merged.split("=======\n")[1].split(">>>>>>> theirs\n")[0]
    assert "# my forward" in yours and "with autocast:" in theirs
    assert resolve(merged, "theirs") == amp_train  # everything outside the markers is the feature's
    assert resolve(merged, "yours") != plain.replace(old, mine)  # the rest of amp did merge
    after, amp = snapshot(project), fresh(features=["amp"])
    others = {p for p in amp.keys() | before.keys() if p != "train.py"}
    assert {p: after.get(p) for p in others} == {p: amp.get(p) for p in others}  # merged cleanly
    untouched = {p for p in before if before[p] == amp.get(p)}  # nothing else touched
    assert {p: after[p] for p in untouched} == {p: before[p] for p in untouched}
    assert features_of(project) == ["amp"]

    # a later add refuses while the markers remain, and changes nothing
    out = scaffold_cli("add", "feature", "compile", "--allow-dirty", cwd=project)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("error: unresolved conflict markers") and "train.py" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert snapshot(project) == after


@pytest.mark.slow
def test_cli_dry_run_then_clean_add(tmp_path):
    project = make_project(tmp_path / "p")
    write_edits(project)
    commit_all(project)
    before = snapshot(project, include_record=True)

    from typer.testing import CliRunner

    from scaffold.cli import app

    out = CliRunner().invoke(app, ["add", "feature", "amp", "--dry-run", "--project", str(project)])
    assert out.exit_code == 0, out.output
    assert "--- a/train.py" in out.stdout and "+++ b/train.py" in out.stdout
    assert '+    precision: str = "auto"' in out.stdout
    assert out.stdout.rstrip().splitlines()[-1].startswith("dry run: feature 'amp' would be added")
    assert snapshot(project, include_record=True) == before

    start = time.perf_counter()
    out = scaffold_cli("add", "feature", "amp", cwd=project)
    print(f"scaffold add feature amp (CLI, clean): {time.perf_counter() - start:.2f} s")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    expected = edit_files(fresh(features=["amp"]))
    changed = sorted(p for p in expected if expected[p] != before.get(p))
    assert "  merged   train.py" in lines and "  updated  README.md" in lines
    assert lines[-1].startswith(f"feature 'amp' added: {len(changed)} files changed, your edits kept")
    assert snapshot(project) == expected

    out = CliRunner().invoke(app, ["add", "feature", "amp", "--project", str(project)])
    assert out.exit_code == 2 and out.stderr.startswith("error: feature 'amp' is already enabled")


# --- add, remove, dry run, refusals ------------------------------------------------------------


@pytest.mark.parametrize("feature", ["callbacks", "ddp", "resume", "export"])
def test_add_then_remove_gives_back_the_edited_files(tmp_path, feature):
    project = make_project(tmp_path / "p")
    write_edits(project)
    commit_all(project)
    before = snapshot(project, include_record=True)
    result, _ = change(project, feature)
    assert result.conflicts == []
    commit_all(project)
    result, lines = change(project, feature, add=False)
    assert result.conflicts == [], lines
    after = snapshot(project, include_record=True)
    record, record_before = (json.loads(files.pop(".scaffold/record.json")) for files in (after, before))
    assert (record.pop("generation"), record_before.pop("generation")) == (2, 0)  # one per commit
    assert (after, record) == (before, record_before)  # files, pristine copy and record


def test_dry_run_writes_nothing(tmp_path):
    project = make_project(tmp_path / "p", features=["callbacks"])
    write_edits(project)
    commit_all(project)
    before = snapshot(project, include_record=True)
    mtimes = {p: (project / p).stat().st_mtime_ns for p in before}
    result, lines = change(project, "callbacks", add=False, dry_run=True)
    text = "\n".join(lines)
    assert not result.written and result.conflicts == []
    assert "--- a/callbacks.py\n+++ /dev/null" in text and "-import callbacks as cb" in text
    assert snapshot(project, include_record=True) == before
    assert {p: (project / p).stat().st_mtime_ns for p in before} == mtimes
    assert not list((project / ".scaffold").glob("backup-*"))


def test_dirty_tree_is_refused_unless_allowed(tmp_path):
    project = make_project(tmp_path / "p")
    (project / "scratch.py").write_text("x = 1\n")  # untracked: fine
    (project / "model.py").write_text((project / "model.py").read_text() + "# wip\n")
    before = snapshot(project, include_record=True)
    with pytest.raises(ScaffoldError) as err:
        change(project, "amp")
    message = str(err.value)
    assert "uncommitted changes" in message and "model.py" in message and "--allow-dirty" in message
    assert "scratch.py" not in message
    assert snapshot(project, include_record=True) == before

    result, _ = change(project, "amp", allow_dirty=True)
    assert result.conflicts == [] and features_of(project) == ["amp"]
    assert (project / "model.py").read_text().endswith("# wip\n")
    assert result.backup is None  # git can give every changed file back


def test_untracked_files_alone_are_not_dirty(tmp_path):
    project = make_project(tmp_path / "p")
    (project / "notes.txt").write_text("mine\n")
    result, _ = change(project, "amp")
    assert result.written and result.backup is None
    assert (project / "notes.txt").read_text() == "mine\n"


def test_missing_git_is_one_clear_error(tmp_path, monkeypatch):
    project = make_project(tmp_path / "p", in_git=False)
    before = snapshot(project, include_record=True)
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(ScaffoldError, match="git was not found on PATH") as err:
        change(project, "amp")
    assert "\n" not in str(err.value)
    assert snapshot(project, include_record=True) == before


def test_not_a_scaffold_project_or_a_damaged_record(tmp_path):
    from scaffold.merge import feature_diff, project_status

    other = tmp_path / "other"
    other.mkdir()
    (other / "train.py").write_text("print('hi')\n")
    for call in (lambda p: change(p, "amp"), project_status, lambda p: feature_diff(p, "amp")):
        with pytest.raises(ScaffoldError, match="not generated by scaffold"):
            call(other)

    project = make_project(tmp_path / "p", in_git=False)
    record = project / ".scaffold" / "record.json"
    good = record.read_bytes()
    record.write_text('{"format": 1, "answers": ')
    with pytest.raises(ScaffoldError, match="record.json is damaged"):
        change(project, "amp")
    record.write_bytes(good)
    pristine = project / ".scaffold" / "pristine.json"
    data = json.loads(pristine.read_text())
    data["train.py"] += "# tampered\n"
    pristine.write_text(json.dumps(data))
    with pytest.raises(ScaffoldError, match="does not match"):
        change(project, "amp")
    assert (project / "train.py").read_bytes() == fresh()["train.py"]


def test_outside_git_the_changed_files_are_backed_up(tmp_path):
    project = make_project(tmp_path / "p", in_git=False)
    write_edits(project)
    before = snapshot(project)
    result, lines = change(project, "amp")
    assert result.conflicts == []
    backup = result.backup
    assert backup is not None and re.fullmatch(r"backup-\d{8}-\d{6}", backup.name)
    assert backup.parent == project / ".scaffold"
    assert f"backup of the files about to change: {backup}" in lines
    saved = snapshot(backup, include_record=True)
    after = snapshot(project)
    assert saved == {p: data for p, data in before.items() if after.get(p) != data}
    assert {"train.py", "README.md"} <= saved.keys()
    assert (project / "train.py").read_bytes() != before["train.py"]


def test_crlf_file_merges_and_keeps_crlf(tmp_path):
    project = make_project(tmp_path / "p")
    train = project / "train.py"
    edited = edit_files(fresh())["train.py"]
    train.write_bytes(edited.replace(b"\n", b"\r\n"))  # an editor on Windows
    commit_all(project)
    result, lines = change(project, "amp")
    assert result.conflicts == [], lines
    data = train.read_bytes()
    assert data.count(b"\n") == data.count(b"\r\n")  # every line CRLF
    assert data.replace(b"\r\n", b"\n") == edit_files(fresh(features=["amp"]))["train.py"]


def test_files_without_a_final_newline(tmp_path):
    project = make_project(tmp_path / "p")
    train, readme = project / "train.py", project / "README.md"
    train.write_bytes(train.read_bytes().rstrip(b"\n").replace(b"    main()", b"    main()  # run"))
    readme.write_bytes(readme.read_bytes().rstrip(b"\n"))  # amp changes README's last lines
    commit_all(project)
    result, lines = change(project, "amp")
    assert result.conflicts == [], lines
    amp = fresh(features=["amp"])
    assert train.read_bytes() == amp["train.py"].rstrip(b"\n").replace(b"    main()", b"    main()  # run")
    assert readme.read_bytes() == amp["README.md"].rstrip(b"\n")


def test_a_file_the_user_deleted_stays_deleted(tmp_path):
    project = make_project(tmp_path / "p")
    (project / "README.md").unlink()  # amp would change it
    commit_all(project)
    result, lines = change(project, "amp")
    assert result.conflicts == [] and not (project / "README.md").exists()
    assert any(line.startswith("note: README.md: you deleted it; left deleted") for line in lines)
    assert (project / "train.py").read_bytes() == fresh(features=["amp"])["train.py"]


def test_removed_but_edited_file_is_kept_as_a_conflict(tmp_path):
    project = make_project(tmp_path / "p", features=["callbacks"])
    callbacks = project / "callbacks.py"
    callbacks.write_text(callbacks.read_text() + "\n\nclass MyCallback:\n    pass\n")
    commit_all(project)
    result, lines = change(project, "callbacks", add=False)
    assert [c.split(":")[0] for c in result.conflicts] == ["callbacks.py"]
    assert "you edited it; kept" in result.conflicts[0]
    assert callbacks.read_text().endswith("class MyCallback:\n    pass\n")
    assert (project / "train.py").read_bytes() == fresh()["train.py"]  # the rest was removed
    assert features_of(project) == []


def test_a_user_file_in_the_way_of_a_new_file_is_not_overwritten(tmp_path):
    project = make_project(tmp_path / "p")
    (project / "callbacks.py").write_text("# my own callbacks\n")
    commit_all(project)
    result, _ = change(project, "callbacks")
    assert [c.split(":")[0] for c in result.conflicts] == ["callbacks.py"]
    assert (project / "callbacks.py").read_text() == "# my own callbacks\n"


def test_a_merge_that_does_not_compile_is_reported(tmp_path):
    project = make_project(tmp_path / "p")
    model = project / "train.py"
    model.write_text(model.read_text() + "\ndef broken(:\n    pass\n")
    commit_all(project)
    result, _ = change(project, "amp")
    assert any(c.startswith("train.py: the merged file does not compile (line ") and
               "nor did your file before the merge" in c for c in result.conflicts)


def test_a_failure_while_merging_writes_nothing(tmp_path):
    project = make_project(tmp_path / "p")
    (project / "train.py").unlink()
    (project / "train.py").mkdir()  # README.md merges first, then train.py fails
    before = snapshot(project, include_record=True)
    with pytest.raises(ScaffoldError, match="train.py is not a file"):
        change(project, "amp", allow_dirty=True)
    assert snapshot(project, include_record=True) == before


def test_a_failed_write_changes_nothing(tmp_path, monkeypatch):
    project = make_project(tmp_path / "p")
    write_edits(project)
    commit_all(project)
    before = snapshot(project, include_record=True)
    calls = []

    def disk_full(root, files):
        calls.append(list(files))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("scaffold.lock.write_files", disk_full)
    with pytest.raises(ScaffoldError, match="writing the merged files failed"):
        change(project, "amp")
    # one write for everything, the record last
    assert len(calls) == 1
    assert sorted(calls[0][-2:]) == [".scaffold/pristine.json", ".scaffold/record.json"]
    assert snapshot(project, include_record=True) == before


class Killed(BaseException):
    pass


def test_a_write_killed_halfway_is_finished_by_the_next_command(tmp_path, monkeypatch):
    import scaffold.write as write_mod

    project = make_project(tmp_path / "p")
    write_edits(project)
    commit_all(project)
    edited = snapshot(project)
    real_apply = write_mod._apply_journal

    def killed_after_one_move(root, ops):
        real_move = os.replace
        moves = []

        def move(src, dst):
            if moves:
                raise Killed()  # the process dies after the commit point and one renamed file
            moves.append(dst)
            real_move(src, dst)

        monkeypatch.setattr(write_mod.os, "replace", move)
        try:
            real_apply(root, ops)
        finally:
            monkeypatch.setattr(write_mod.os, "replace", real_move)

    monkeypatch.setattr(write_mod, "_apply_journal", killed_after_one_move)
    with pytest.raises(Killed):
        change(project, "amp")
    assert features_of(project) == [] and snapshot(project) != edited  # half written
    monkeypatch.setattr(write_mod, "_apply_journal", real_apply)

    result, lines = change(project, "amp", add=False, allow_dirty=True)  # the next command
    assert lines[0] == "note: finished an earlier scaffold write in this project that was interrupted"
    assert result.conflicts == [] and features_of(project) == []
    assert snapshot(project) == edited  # amp was completed, then removed: the user's files


def test_already_enabled_not_enabled_and_unknown(tmp_path):
    project = make_project(tmp_path / "p", features=["amp"], in_git=False)
    with pytest.raises(ScaffoldError, match="'amp' is already enabled.*nothing to do"):
        change(project, "amp")
    with pytest.raises(ScaffoldError, match="'resume' is not enabled.*nothing to do"):
        change(project, "resume", add=False)
    with pytest.raises(UsageError, match="unknown feature 'fp8'"):
        change(project, "fp8")
    assert features_of(project) == ["amp"]


def test_requires_and_conflicts_from_the_catalogue(tmp_path, monkeypatch):
    import dataclasses

    import scaffold.catalogue as catalogue

    patched = dict(catalogue.FEATURES)
    patched["early-stopping"] = dataclasses.replace(patched["early-stopping"], requires=("callbacks",))
    patched["compile"] = dataclasses.replace(patched["compile"], conflicts=("ddp",))
    monkeypatch.setattr(catalogue, "FEATURES", patched)

    def project_with(name, features):
        # the checks come before any render, so a plain project whose record lists the features
        # stands in for a real one
        project = shutil.copytree(plain, tmp_path / name)
        record = project / ".scaffold" / "record.json"
        data = json.loads(record.read_text())
        data["answers"]["features"] = features
        record.write_text(json.dumps(data))
        return project

    plain = make_project(tmp_path / "plain", in_git=False)
    with pytest.raises(UsageError, match="requires 'callbacks'.*scaffold add feature callbacks"):
        change(plain, "early-stopping")
    both = project_with("both", ["callbacks", "early-stopping"])
    with pytest.raises(UsageError, match="required by 'early-stopping'.*scaffold remove feature early-stopping"):
        change(both, "callbacks", add=False)
    ddp = project_with("ddp", ["ddp"])
    with pytest.raises(UsageError, match="conflicts with 'ddp'.*scaffold remove feature ddp"):
        change(ddp, "compile")
    for project in (plain, both, ddp):
        assert not list((project / ".scaffold").glob("backup-*"))


def test_changed_templates_are_refused_until_upgrade(tmp_path):
    """Merging a feature against a re-rendered base would record the installed templates
    without their changes: `scaffold upgrade` comes first."""
    project = make_project(tmp_path / "p")
    write_edits(project)
    commit_all(project)
    record = project / ".scaffold" / "record.json"
    data = json.loads(record.read_text())
    data["template"], data["template_version"] = "0123456789abcdef", 1  # another version's
    record.write_text(json.dumps(data))
    commit_all(project)
    before = snapshot(project, include_record=True)
    with pytest.raises(ScaffoldError, match="template version 1 .*run 'scaffold upgrade' first"):
        change(project, "amp")
    assert snapshot(project, include_record=True) == before


# --- diff feature, status ----------------------------------------------------------------------


def test_diff_feature_is_the_patch_of_the_feature(tmp_path):
    from scaffold.merge import feature_diff

    plain = make_project(tmp_path / "plain", in_git=False)
    with_amp = make_project(tmp_path / "amp", features=["amp"], in_git=False)
    patch = feature_diff(plain, "amp")
    assert feature_diff(with_amp, "amp") == patch  # the same patch, enabled or not
    assert ".scaffold" not in patch and "+++ b/train.py" in patch and "+++ b/README.md" in patch
    # applied to the plain render, the patch gives the amp render exactly
    target = tmp_path / "apply"
    target.mkdir()
    for rel, data in fresh().items():
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        (target / rel).write_bytes(data)
    subprocess.run(["git", "apply", "-"], cwd=target, input=patch.encode(), check=True)
    assert snapshot(target) == fresh(features=["amp"])

    from typer.testing import CliRunner

    from scaffold.cli import app

    out = CliRunner().invoke(app, ["diff", "feature", "callbacks", "--project", str(plain), "--no-color"])
    assert out.exit_code == 0 and "--- /dev/null\n+++ b/callbacks.py" in out.stdout
    assert "\x1b[" not in out.stdout


def test_status_lists_versions_features_and_user_changes(tmp_path):
    from scaffold import __version__
    from scaffold.merge import project_status

    project = make_project(tmp_path / "p", features=["amp"], in_git=False)
    assert project_status(project)[-1] == "files: all generated files as rendered; no Python files added"
    write_edits(project)
    (project / "runs").mkdir()
    (project / "runs" / "generated_by_a_run.py").write_text("")
    (project / ".venv" / "lib").mkdir(parents=True)
    (project / ".venv" / "lib" / "site.py").write_text("")
    lines = project_status(project)
    assert lines[0].startswith(f"project: {NAME} (")
    from scaffold.versions import TEMPLATE_VERSION

    version = f"scaffold {__version__}, template version {TEMPLATE_VERSION}"
    assert lines[1] == f"made by: {version} (installed: {version}; up to date)"
    assert lines[2:4] == ["task: image-classification", "features: amp"]
    assert lines[4:] == [
        "since the last render:",
        "  modified  model.py",
        "  modified  train.py",
        f"  deleted   {DELETED}",
        f"  added     {NEW_FILE[0]}",
    ]

    from typer.testing import CliRunner

    from scaffold.cli import app

    out = CliRunner().invoke(app, ["status", "--project", str(tmp_path)])
    assert out.exit_code == 2 and out.stderr.startswith("error: ") and "not generated by scaffold" in out.stderr
