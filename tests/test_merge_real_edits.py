"""`add/remove feature` against the edits real users make (issue 20), in-process, no training.

Each test is one scripted edit from benchmarks/merge_scenarios.py (the measure) or one of the
smaller promises: a merge checked for meaning, honest leftovers, insertions kept both, the user's
formatting and encoding kept, exit codes that mean one thing, backups that do not pile up.
"""

from __future__ import annotations

import csv
import importlib.util
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from scaffold.errors import ScaffoldError
from test_merge import (  # noqa: F401  (memo_render: the shared render memo, autouse)
    change,
    commit_all,
    features_of,
    fresh,
    make_project,
    memo_render,
    snapshot,
)

_spec = importlib.util.spec_from_file_location("merge_scenarios", REPO / "benchmarks" / "merge_scenarios.py")
scenarios = importlib.util.module_from_spec(_spec)
sys.modules["merge_scenarios"] = scenarios  # dataclasses look their module up
_spec.loader.exec_module(scenarios)
BY_NAME = {s.name: s for s in scenarios.SCENARIOS}


def edited_project(tmp_path, scenario: str, features=(), in_git=False) -> Path:
    """A fresh project with `features`, edited by the scenario's script."""
    project = make_project(tmp_path / "p", features=features, in_git=False)
    files = scenarios._tree(project)
    after = BY_NAME[scenario].edit(files, project)
    for rel in files.keys() - after.keys():
        (project / rel).unlink()
    for rel, data in after.items():
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_bytes(data)
    if in_git:
        from test_merge import git

        git(project, "-c", "init.defaultBranch=main", "init", "-q")
        commit_all(project, "generated and edited")
    return project


def last(lines):
    return lines[-1]


# --- a merge checked for meaning -------------------------------------------------------------


def test_renamed_optimizer_then_add_resume_names_the_cause(tmp_path):
    project = edited_project(tmp_path, "rename-optimizer")
    result, lines = change(project, "resume")
    assert result.written and result.exit_code == 1
    problems = [p for p in result.problems if "`optimizer`" in p]
    assert problems and all(re.match(r"train\.py:\d+ uses `optimizer`; your code calls it `opt`", p)
                            for p in problems), result.problems
    line = int(problems[0].split(":")[1].split()[0])
    assert "optimizer" in (project / "train.py").read_text().splitlines()[line - 1]
    assert "your edits kept" not in last(lines) and "need your hand" in last(lines)


@pytest.mark.parametrize("scenario, feature, name", [
    ("tb-writer-line", "tensorboard", "tb_writer"),
    ("scaler-line", "amp", "scaler"),
])
def test_a_user_line_using_what_a_removed_feature_defined_is_listed(tmp_path, scenario, feature, name):
    project = edited_project(tmp_path, scenario, features=[feature])
    result, lines = change(project, feature, add=False)
    assert result.written and result.exit_code == 1 and features_of(project) == []
    text = (project / "train.py").read_text().splitlines()
    hits = [item for item in result.to_resolve if f"`{name}`" in item]
    assert len(hits) == 1, result.to_resolve
    line = int(hits[0].split(":")[1].split()[0])
    assert name in text[line - 1] and "# my" in text[line - 1]
    assert "removed:" not in last(lines) and "your edits kept" not in last(lines)


def test_moved_feature_code_is_a_listed_leftover_never_removed(tmp_path):
    project = edited_project(tmp_path, "moved-amp", features=["amp"])
    result, lines = change(project, "amp", add=False)
    assert result.exit_code == 1 and result.leftovers
    text = (project / "train.py").read_text().splitlines()
    listed = {int(item.split(":")[1]) for item in result.leftovers}
    for number, line in enumerate(text, 1):  # every amp line still there is listed
        if "[amp]" in line.split("#", 1)[-1] and line.lstrip().startswith("#"):
            assert number in listed, (number, line)
    assert any("setup_precision" in text[n - 1] for n in listed)
    assert any("cfg.precision" in text[n - 1] for n in listed)
    assert "removed:" not in last(lines)


def test_meaning_check_ignores_what_the_user_already_had(tmp_path):
    project = make_project(tmp_path / "p", in_git=False)
    train = project / "train.py"
    train.write_text(train.read_text() + "\n\ndef mine():\n    return not_defined_anywhere\n")
    result, _ = change(project, "amp")
    assert result.exit_code == 0 and result.problems == []


# --- insertions at one place -----------------------------------------------------------------


@pytest.mark.parametrize("scenario", ["config-block", "post-init-check"])
@pytest.mark.parametrize("feature", ["amp", "resume"])
def test_both_sides_inserting_at_one_place_keeps_both(tmp_path, scenario, feature):
    project = edited_project(tmp_path, scenario)
    mine = (project / "train.py").read_text()
    result, lines = change(project, feature)
    assert result.exit_code == 0, result.to_resolve
    if scenario == "config-block":  # both append a Config field: an insert/insert spot
        assert result.auto_resolved and "kept both" in result.auto_resolved[0]
        assert any(line.startswith("merged automatically (") for line in lines)
    merged = (project / "train.py").read_text()
    ideal = fresh(features=[feature])["train.py"].decode()
    own = [line for line in mine.splitlines() if "# my" in line or "# mine" in line]
    assert own and all(line in merged for line in own)
    assert set(ideal.splitlines()) <= set(merged.splitlines())  # every feature line is there
    compile(merged, "train.py", "exec")


# --- the user's formatting -------------------------------------------------------------------


def _black(text: str, length: int) -> str:
    import black

    return black.format_str(text, mode=black.Mode(line_length=length))


@pytest.mark.parametrize("feature", ["amp", "resume"])
def test_black_100_merges_clean_and_stays_at_100(tmp_path, feature):
    project = edited_project(tmp_path, "black-100")
    result, _ = change(project, feature)
    assert result.exit_code == 0 and result.auto_resolved == [], result.to_resolve
    ideal = _black(fresh(features=[feature])["train.py"].decode(), 100)
    assert (project / "train.py").read_text() == ideal


def test_tabs_merge_clean_and_stay_tabs(tmp_path):
    from scaffold.style import to_tabs

    project = edited_project(tmp_path, "tabs", features=["amp"])
    result, _ = change(project, "amp", add=False)
    assert result.exit_code == 0, result.to_resolve
    assert (project / "train.py").read_text() == to_tabs(fresh()["train.py"].decode())


@pytest.mark.parametrize("scenario", ["ruff-format-100", "isort-google"])
def test_ruff_formatted_projects_merge_clean(tmp_path, scenario):
    project = edited_project(tmp_path, scenario)
    result, _ = change(project, "amp")
    assert result.exit_code == 0 and result.auto_resolved == [], result.to_resolve
    # the result is what the user's own tool makes of the feature's render
    ideal = scenarios._tree(make_project(tmp_path / "ideal", features=["amp"], in_git=False))
    ideal = BY_NAME[scenario].edit(ideal, tmp_path / "ideal")
    assert (project / "train.py").read_bytes() == ideal["train.py"]


# --- text is text ----------------------------------------------------------------------------


def test_cp1252_file_merges_in_its_own_encoding(tmp_path):
    project = edited_project(tmp_path, "cp1252")
    result, _ = change(project, "amp")
    assert result.exit_code == 0, result.to_resolve
    data = (project / "train.py").read_bytes()
    text = data.decode("cp1252")
    assert "Graine fixée" in text and text.startswith("# -*- coding: cp1252 -*-\n")
    ideal = BY_NAME["cp1252"].edit(fresh(features=["amp"]), tmp_path)["train.py"]
    assert data == ideal


def test_mixed_line_endings_are_kept_line_by_line(tmp_path):
    project = edited_project(tmp_path, "crlf-mixed")
    before = (project / "train.py").read_bytes()
    lf_lines = {line for line in before.split(b"\n") if not line.endswith(b"\r") and line}
    result, _ = change(project, "amp")
    assert result.exit_code == 0
    after = (project / "train.py").read_bytes()
    assert after.replace(b"\r\n", b"\n") == fresh(features=["amp"])["train.py"]
    kept_lf = {line for line in after.split(b"\n") if not line.endswith(b"\r") and line}
    still_there = {line for line in lf_lines if line in after.replace(b"\r\n", b"\n").split(b"\n")}
    assert len(still_there) > 10 and still_there <= kept_lf  # LF lines stay LF, the rest CRLF
    assert after.count(b"\r\n") > after.count(b"\n") - after.count(b"\r\n")


def test_a_file_that_cannot_be_merged_stops_everything(tmp_path):
    project = make_project(tmp_path / "p", in_git=False)
    train = project / "train.py"
    train.write_bytes(train.read_bytes().replace(b"import argparse\n", b"import argparse  # \x00\n"))
    before = snapshot(project, include_record=True)
    with pytest.raises(ScaffoldError, match=r"cannot merge train\.py: train\.py is binary.*nothing was written") as err:
        change(project, "amp")
    assert err.value.code == 2
    assert snapshot(project, include_record=True) == before
    assert not list((project / ".scaffold").glob("backup-*"))


# --- exit codes, messages, the smaller promises ----------------------------------------------


def test_exit_codes_mean_one_thing(tmp_path):
    from typer.testing import CliRunner

    from scaffold.cli import app

    clean = make_project(tmp_path / "clean", in_git=False)
    out = CliRunner().invoke(app, ["add", "feature", "amp", "--project", str(clean)])
    assert out.exit_code == 0, out.output
    out = CliRunner().invoke(app, ["add", "feature", "amp", "--project", str(clean)])
    assert out.exit_code == 2 and "nothing to do" in out.stderr
    project = make_project(tmp_path / "p", in_git=False)
    train = project / "train.py"
    forward = "                loss_sum, count = compute_loss(model, batch, loss_args)\n"
    train.write_text(train.read_text().replace(forward, forward[:-1] + "  # mine\n"))  # amp moves it
    out = CliRunner().invoke(app, ["add", "feature", "amp", "--project", str(project)])
    assert out.exit_code == 1 and "conflicts (1):" in out.stdout
    assert out.stdout.splitlines()[-1].startswith("feature 'amp' added with 1 conflict: resolve the markers")


@pytest.mark.parametrize("feature", ["amp", "grad-accum", "ddp", "fsdp"])
def test_your_own_loss_is_never_rewritten_by_a_feature(tmp_path, feature):
    """Label smoothing in model.py's summed_loss: the loop calls compute_loss, the features wrap
    the call, so adding amp, grad-accum, ddp or fsdp merges cleanly and keeps the user's loss."""
    project = edited_project(tmp_path, "label-smoothing")
    result, lines = change(project, feature)
    assert result.exit_code == 0 and result.markers == 0, lines
    assert "label_smoothing=0.1" in (project / "model.py").read_text()
    assert (project / "train.py").read_bytes() == fresh(features=[feature])["train.py"]


@pytest.mark.parametrize("feature", ["amp", "grad-accum", "ddp", "fsdp"])
def test_your_own_metric_is_never_rewritten_by_a_feature(tmp_path, feature):
    """A metric of the user's own in model.py's validation_metrics: evaluate() calls the task's
    validation_sums and validation_metrics, the features wrap the calls and sum over ranks, so
    adding amp, grad-accum, ddp or fsdp merges cleanly and keeps the metric and its column."""
    project = edited_project(tmp_path, "own-metric")
    result, lines = change(project, feature)
    assert result.exit_code == 0 and result.markers == 0, lines
    assert '"val_error": 1 - correct / count' in (project / "model.py").read_text()
    columns = '    "val_acc",\n]'
    expected = fresh(features=[feature])["train.py"].decode().replace(columns, columns[:-1] + '    "val_error",\n]')
    assert (project / "train.py").read_text() == expected


@pytest.mark.slow
def test_your_own_metric_is_logged_by_two_ranks(tmp_path):
    """The own-metric edit, then ddp added: two gloo ranks (torchrun) train, and every epoch's
    row of metrics.csv has the user's val_error, from the totals summed over both shards."""
    from conftest import TINY

    project = edited_project(tmp_path, "own-metric")
    assert change(project, "ddp")[0].markers == 0
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    proc = subprocess.run([*torchrun, "train.py", *TINY, "--synthetic-val-size", "37", "--epochs", "2",
                           "--out-dir", "run"], cwd=project, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(project / "run" / "metrics.csv") as f:
        rows = [row for row in csv.DictReader(f) if row["val_loss"]]
    assert len(rows) == 2
    for row in rows:
        assert float(row["val_error"]) == pytest.approx(1 - float(row["val_acc"]), abs=1e-12), row


@pytest.mark.parametrize("feature", ["amp", "grad-accum", "ddp", "fsdp"])
def test_a_multi_label_head_is_never_rewritten_by_a_feature(tmp_path, feature):
    """The README's worked example (a multi-label head, BCEWithLogitsLoss, dict batches from
    data.py, a val_f1 column): amp, grad-accum, ddp and fsdp wrap model.py's calls, so each merges
    cleanly and leaves model.py, data.py and evaluate.py as the user wrote them."""
    project = edited_project(tmp_path, "multi-label")
    edited = {rel: (project / rel).read_bytes() for rel in ("model.py", "data.py", "evaluate.py")}
    assert b"binary_cross_entropy_with_logits" in edited["model.py"]
    result, lines = change(project, feature)
    assert result.exit_code == 0 and result.markers == 0, lines
    assert {rel: (project / rel).read_bytes() for rel in edited} == edited
    columns = '    "val_acc",\n]'
    expected = fresh(features=[feature])["train.py"].decode().replace(columns, columns[:-1] + '    "val_f1",\n]')
    assert (project / "train.py").read_text() == expected


def write_tagged_images(root: Path) -> None:
    """DATA/<split>/red, round and red+round: red squares, grey disks and red disks (PNG)."""
    from PIL import Image, ImageDraw

    for split, n in (("train", 25), ("val", 6)):
        for name in ("red", "round", "red+round"):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(n):
                colour = (200 + i % 50, 30, 30) if "red" in name else (120, 120, 120 + i)
                image = Image.new("RGB", (24, 24), (20, 20, 20) if "round" in name else colour)
                if "round" in name:
                    ImageDraw.Draw(image).ellipse((4 + i % 3, 4, 19, 19 - i % 3), fill=colour)
                image.save(folder / f"{i}.png")


@pytest.mark.slow
def test_a_multi_label_project_passes_its_own_suite_on_its_own_data(tmp_path):
    """The worked example, then ddp added: the project's whole suite (evaluate.py's per-tag
    numbers and predict.py included) passes on the built-in data and with --data-dir=DATA on
    tagged image folders, two gloo ranks included; a training on DATA learns its two tags."""
    from conftest import TINY

    project = edited_project(tmp_path, "multi-label")
    assert change(project, "ddp")[0].markers == 0
    data_dir = tmp_path / "data"
    write_tagged_images(data_dir)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    pytest_run = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider"]
    for extra in ([], [f"--data-dir={data_dir}"]):
        proc = subprocess.run([*pytest_run, *extra], cwd=project, capture_output=True, text=True,
                              timeout=1200, env=env)
        assert proc.returncode == 0, (extra, proc.stdout[-4000:] + proc.stderr[-2000:])
        ran = re.findall(r"^tests/(test_\w+)\.py::\S+ PASSED", proc.stdout, re.M)
        assert {"test_core", "test_data", "test_ddp", "test_after_training"} <= set(ran), proc.stdout[-4000:]
        assert "SKIPPED" not in proc.stdout and "FAILED" not in proc.stdout
    proc = subprocess.run([sys.executable, "train.py", *TINY, "--data-dir", str(data_dir),
                           "--epochs", "2", "--out-dir", "run"], cwd=project, capture_output=True,
                          text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import torch

    final = torch.load(project / "run" / "final.pt", weights_only=True)
    assert final["data"]["tags"] == ["red", "round"]
    assert final["data"]["classes"] == ["red", "red+round", "round"]
    assert final["model"]["head.weight"].shape[0] == 2  # one logit per tag


def test_no_markers_no_resolve_the_markers_and_conflicts_are_counted(tmp_path):
    project = make_project(tmp_path / "p", in_git=False)
    (project / "callbacks.py").write_text("# my own callbacks\n")
    result, lines = change(project, "callbacks")
    assert result.exit_code == 1 and result.markers == 0
    assert "conflicts (1):" in lines and "resolve the markers" not in last(lines)


def test_user_git_conflict_markers_are_detected(tmp_path):
    project = make_project(tmp_path / "p", in_git=False)
    model = project / "model.py"
    model.write_text(model.read_text() + "<<<<<<< HEAD\nx = 1\n=======\nx = 2\n>>>>>>> feature\n")
    with pytest.raises(ScaffoldError, match=r"unresolved conflict markers \(<<<<<<<\) in model\.py"):
        change(project, "amp")


def test_deleted_tests_folder_gets_no_lone_test_file(tmp_path):
    project = edited_project(tmp_path, "no-tests")
    result, lines = change(project, "amp")
    assert result.exit_code == 0 and not (project / "tests" / "test_amp.py").exists()
    assert "note: tests/: you deleted it; tests/test_amp.py not created" in lines


def test_allow_dirty_backs_up_the_dirty_tracked_files(tmp_path):
    project = make_project(tmp_path / "p")
    train = project / "train.py"
    train.write_text(train.read_text().replace("    torch.manual_seed(cfg.seed)\n",
                                               "    torch.manual_seed(cfg.seed)  # wip\n"))
    wip = train.read_bytes()
    result, _ = change(project, "amp", allow_dirty=True)
    assert result.exit_code == 0 and result.backup is not None
    assert (result.backup / "train.py").read_bytes() == wip
    assert not (result.backup / "README.md").exists()  # committed: git has it


def test_backups_do_not_pile_up_and_git_ignores_them(tmp_path):
    from scaffold.engine import KEEP_BACKUPS

    project = make_project(tmp_path / "p", in_git=False)
    for _ in range(3):
        for add in (True, False):
            change(project, "amp", add=add)
    backups = list((project / ".scaffold").glob("backup-*"))
    assert len(backups) == KEEP_BACKUPS
    assert ".scaffold/backup-*/" in (project / ".gitignore").read_text().splitlines()


def test_a_refused_command_leaves_no_backup(tmp_path):
    project = make_project(tmp_path / "p", in_git=False)
    real = tmp_path / "elsewhere.py"
    real.write_bytes((project / "train.py").read_bytes())
    (project / "train.py").unlink()
    (project / "train.py").symlink_to(real)
    with pytest.raises(ScaffoldError, match="symbolic link"):
        change(project, "amp")
    assert not list((project / ".scaffold").glob("backup-*"))


def test_ctrl_c_after_everything_is_written_is_a_success(tmp_path):
    project = make_project(tmp_path / "p", in_git=False)
    seen = []

    def echo(line):
        seen.append(line)
        if line.startswith("  updated"):
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the report is printed

    from scaffold.merge import change_feature

    result = change_feature(project, "amp", add=True, echo=echo)
    assert result.written and result.exit_code == 0 and features_of(project) == ["amp"]
    assert seen[-1].startswith("feature 'amp' added:")


def test_the_project_is_found_from_a_subfolder(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from scaffold.cli import app

    project = make_project(tmp_path / "p", in_git=False)
    monkeypatch.chdir(project / "tests")
    out = CliRunner().invoke(app, ["status"])
    assert out.exit_code == 0, out.output
    assert out.stdout.startswith(f"project: proj ({project.resolve()})")


def test_ctrl_c_while_python_imports_the_cli_is_one_line(tmp_path):
    # the module entry point catches an interrupt raised while importing scaffold.cli
    code = ("import builtins, runpy, sys\n"
            "real = builtins.__import__\n"
            "def imp(name, *a, **k):\n"
            "    if name == 'scaffold.cli':\n"
            "        raise KeyboardInterrupt\n"
            "    return real(name, *a, **k)\n"
            "builtins.__import__ = imp\n"
            "runpy.run_module('scaffold', run_name='__main__')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 130 and "Traceback" not in out.stderr
    assert out.stderr == "error: interrupted; no file was changed: run the command again\n"


# --- the measure -----------------------------------------------------------------------------


@pytest.mark.slow  # no training, but about 30 merges with black and ruff runs: ~40 s
def test_the_measure_meets_its_targets(tmp_path):
    """benchmarks/merge_scenarios.py with amp (the whole table: the benchmark): nothing lost, no
    silent leftover, no clean merge that breaks, no conflict from formatting, import order or pure
    insertions."""
    results = scenarios.run(features=("amp",), workdir=tmp_path)
    print("\n" + scenarios.table(results))
    outcomes = {key: outcome for key, (outcome, _) in results.items()}
    assert len(outcomes) >= 28
    bad = {k: results[k] for k, o in outcomes.items() if o in ("LOST", "SILENT", "BROKEN", "refused")}
    assert bad == {}
    kinds = {s.name: s.kind for s in scenarios.SCENARIOS}
    noisy = {k: results[k] for k, o in outcomes.items()
             if kinds[k[0]] in ("format", "insert") and o not in ("clean", "auto")}
    assert noisy == {}
    expected = {("rename-optimizer", "add", "amp"): {"conflict"},
                ("scaler-line", "remove", "amp"): {"leftover", "conflict"},
                ("moved-amp", "remove", "amp"): {"leftover"},
                ("tb-writer-line", "remove", "tensorboard"): {"leftover", "conflict"}}
    for key, allowed in expected.items():
        assert outcomes[key] in allowed, (key, results[key])
