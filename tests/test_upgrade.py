"""`scaffold upgrade`, `check`, `diff upgrade` and the template version history.

Three kinds of test:
- the history: the installed templates are the last version in scaffold/template_history.json
  (this FAILS when the templates change without a new version), and every version's fingerprint
  is the one of its commit's templates (so an entry, once committed, cannot change);
- real upgrades: projects rendered with the templates of an earlier commit of this repository
  (`git archive COMMIT templates`), edited, then upgraded with the current templates;
- synthetic template changes (a changed line, a new file, a removed file, a renamed flag, a
  renamed file) against scripted user edits: kept, applied, conflicts, kill -9 mid-upgrade.
Renders are memoised per (answers, template folder) within this file.
"""

from __future__ import annotations

import difflib
import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, commit_all, git
from scaffold.errors import ScaffoldError
from test_hostile import cli, file_operations, kill_points, read_tree, run_and_signal

NAME = "proj"
# The earlier template versions the real upgrade tests start from (the history's entry for each
# names its commit): 4 differs from version 6 in every file kind; 6 is commit c37789f, the
# templates before the upgrade command existed (skipped while they are today's).
OLD_VERSIONS = [4, 6]
_RENDERS: dict = {}


@pytest.fixture(autouse=True)
def memo_render(monkeypatch):
    import scaffold.render as render_mod

    real = render_mod.render

    def render(answers, templates=None):
        key = (json.dumps(answers.as_data(), sort_keys=True), str(templates),
               render_mod.template_fingerprint(templates))
        if key not in _RENDERS:
            _RENDERS[key] = real(answers, templates)
        return dict(_RENDERS[key])

    monkeypatch.setattr(render_mod, "render", render)
    monkeypatch.setattr("scaffold.upgrade.render", render)


def write_project(dest: Path, task="image-classification", features=(), templates=None,
                  in_git=True) -> Path:
    from scaffold.answers import Answers
    from scaffold import render as render_mod
    from scaffold.write import write_new_project

    write_new_project(dest, render_mod.project_files(Answers(NAME, task, list(features)), templates))
    if in_git:
        git(dest, "-c", "init.defaultBranch=main", "init", "-q")
        commit_all(dest, "generated")
    return dest


def generated(files: dict[str, bytes]) -> dict[str, bytes]:
    return {p: d for p, d in files.items() if not p.startswith(".scaffold/")}


def project_files(root: Path) -> dict[str, bytes]:
    return {p: d for p, d in read_tree(root).items() if not p.startswith((".scaffold/", ".git/"))}


def quiet(*_):
    pass


# --- the version history ---------------------------------------------------------------------


def history_problems(fingerprint: str, versions, same_output=None) -> list[str]:
    """Why the installed templates (`fingerprint`, their source hash) do not match the history.

    They match when they are the last version's fingerprint, or listed in `same_output` for it
    (templates restructured without changing what they render)."""
    from scaffold.versions import TEMPLATE_VERSION

    problems = []
    same_output = {} if same_output is None else same_output
    last = versions[-1] if versions else None
    if last is None or (last.fingerprint != fingerprint and same_output.get(fingerprint) != last.version):
        problems.append(
            f"the templates changed (fingerprint {fingerprint}) but template version "
            f"{TEMPLATE_VERSION} is {last.fingerprint if last else 'missing'}: add "
            f'{{"version": {TEMPLATE_VERSION + 1}, "fingerprint": "{fingerprint}", "commit": "", '
            f'"migrations": []}} to scaffold/template_history.json and set TEMPLATE_VERSION = '
            f"{TEMPLATE_VERSION + 1} in scaffold/versions.py; or, if every file of "
            f'generated_examples/ is byte for byte the same, add {{"fingerprint": "{fingerprint}", '
            f'"version": {TEMPLATE_VERSION}}} to its "same_output" list'
        )
    if versions and versions[-1].version != TEMPLATE_VERSION:
        problems.append(f"TEMPLATE_VERSION is {TEMPLATE_VERSION}, the history ends at "
                        f"{versions[-1].version}")
    return problems


def test_the_installed_templates_are_the_last_version_in_the_history():
    from scaffold.render import source_fingerprint
    from scaffold.versions import _read, history

    assert history_problems(source_fingerprint(), history(), _read()[1]) == []


def test_same_output_templates_record_their_version():
    """Templates listed in same_output render a version byte for byte: a project records that
    version's own fingerprint; any other templates record their own hash."""
    from scaffold.versions import _read, canonical, history

    for fingerprint, number in _read()[1].items():
        assert canonical(fingerprint) == history()[number - 1].fingerprint
    assert canonical("0123456789abcdef") == "0123456789abcdef"


def test_the_version_check_fails_when_a_template_changes(tmp_path):
    from scaffold.render import source_fingerprint, template_dir
    from scaffold.versions import _read, history

    changed = tmp_path / "templates"
    shutil.copytree(template_dir(), changed)
    train = changed / "project" / "train.py.jinja"
    train.write_text(train.read_text() + "\n# one more line\n")
    problems = history_problems(source_fingerprint(changed), history(), _read()[1])
    assert len(problems) == 1 and "the templates changed" in problems[0]


def _archive(commit: str, dest: Path) -> Path | None:
    """`git archive COMMIT templates` into dest; None where the commit is not in this clone."""
    if not (REPO / ".git").exists():
        return None
    known = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"],
                           capture_output=True)
    if known.returncode != 0:
        return None
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "templates"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest / "templates"


def _old_templates(version: int, tmp_path_factory) -> Path:
    from scaffold.versions import history

    entry = history()[version - 1]
    folder = _archive(entry.commit, tmp_path_factory.mktemp(f"templates-v{version}"))
    if folder is None:  # a shallow clone or an unpacked archive: no history to render from
        pytest.skip(f"commit {entry.commit[:12]} (template version {version}) is not in this "
                    "clone: run 'git fetch --unshallow' for the version-to-version tests")
    return folder


def test_every_version_is_the_fingerprint_of_its_commit(tmp_path):
    """An entry of the history can never change: it must stay its commit's fingerprint."""
    from scaffold.render import template_fingerprint
    from scaffold.versions import history

    checked = 0
    for entry in history():
        if not entry.commit:  # not committed yet: the newest; fill it in later (never change it)
            continue
        folder = _archive(entry.commit, tmp_path / str(entry.version))
        if folder is None:
            continue
        assert template_fingerprint(folder) == entry.fingerprint, entry
        checked += 1
    if checked == 0:
        pytest.skip("no commit of the history is in this clone (shallow?)")


def changed_entries(old: list[dict], current: list[dict]) -> list[int]:
    """The versions of `old` (a committed history) that `current` lost or changed."""
    changed = []
    for entry in old:
        now = next((e for e in current if e.get("version") == entry["version"]), None)
        if now is not None and not entry.get("commit"):  # naming its commit later is allowed
            now = {**now, "commit": entry.get("commit")}
        if now != entry:
            changed.append(entry["version"])
    return changed


def test_a_bad_same_output_list_is_refused():
    from scaffold.versions import parse_history, parse_same_output

    versions = parse_history({"versions": [{"version": 1, "fingerprint": "0" * 16}]})
    for same, why in (([{"fingerprint": "1" * 16, "version": 2}], "not in the history"),
                      ([{"fingerprint": "0" * 16, "version": 1}], "twice"),
                      ([{"fingerprint": "xyz", "version": 1}], "16 hex")):
        with pytest.raises(ValueError, match=why):
            parse_same_output({"same_output": same}, versions)
    assert parse_same_output({"same_output": [{"fingerprint": "1" * 16, "version": 1}]},
                             versions) == {"1" * 16: 1}


def test_the_history_check_catches_a_changed_entry():
    old = [{"version": 1, "fingerprint": "0" * 16, "commit": "abc", "migrations": []},
           {"version": 2, "fingerprint": "1" * 16, "commit": "", "migrations": []}]
    later = [old[0], {**old[1], "commit": "def"}, {"version": 3, "fingerprint": "2" * 16}]
    assert changed_entries(old, later) == []
    assert changed_entries(old, [{**old[0], "fingerprint": "3" * 16}, old[1]]) == [1]
    assert changed_entries(old, [old[0], {**old[1], "migrations": [{"x": 1}]}]) == [2]
    assert changed_entries(old, [old[0]]) == [2]


def test_committed_history_entries_never_change():
    """Every entry in every committed version of the history file is still there, unchanged."""
    log = subprocess.run(["git", "-C", str(REPO), "log", "--format=%H", "--",
                          "scaffold/template_history.json"], capture_output=True, text=True)
    if log.returncode != 0 or not log.stdout.strip():
        pytest.skip("the history file has no git history in this clone")
    data = json.loads((REPO / "scaffold" / "template_history.json").read_text())
    current, same_output = data["versions"], data.get("same_output", [])
    for commit in log.stdout.split():
        old = json.loads(git(REPO, "show", f"{commit}:scaffold/template_history.json"))
        assert changed_entries(old["versions"], current) == [], f"changed since {commit[:12]}"
        same = old.get("same_output", [])
        assert same_output[:len(same)] == same, f"same_output changed since {commit[:12]}"


@pytest.mark.parametrize("data, why", [
    ([], "expected"),
    ({"versions": [{"version": 2, "fingerprint": "0" * 16}]}, "version 1"),
    ({"versions": [{"version": 1, "fingerprint": "xyz"}]}, "16 hex"),
    ({"versions": [{"version": 1, "fingerprint": "0" * 16},
                   {"version": 2, "fingerprint": "0" * 16}]}, "same fingerprint"),
    ({"versions": [{"version": 1, "fingerprint": "0" * 16,
                    "migrations": [{"run": {"from": "a", "to": "b"}}]}]}, "unknown migration"),
    ({"versions": [{"version": 1, "fingerprint": "0" * 16,
                    "migrations": [{"rename_file": {"from": "../x", "to": "b"}}]}]}, "needs"),
    ({"versions": [{"version": 1, "fingerprint": "0" * 16,
                    "migrations": [{"rename_flag": {"from": "a b", "to": "c"}}]}]}, "needs"),
])
def test_a_bad_history_is_refused(data, why):
    from scaffold.versions import parse_history

    with pytest.raises(ValueError, match=why):
        parse_history(data)


# --- the record format -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def current_project(tmp_path_factory) -> Path:
    return write_project(tmp_path_factory.mktemp("cur") / NAME, in_git=False)


def _edit_record(project: Path, change) -> None:
    path = project / ".scaffold" / "record.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_a_format_1_record_is_read_and_its_version_looked_up(tmp_path, current_project):
    from scaffold.record import load_record
    from scaffold.versions import TEMPLATE_VERSION

    project = tmp_path / NAME
    shutil.copytree(current_project, project)
    _edit_record(project, lambda d: (d.pop("template_version"), d.__setitem__("format", 1)))
    record = load_record(project)
    assert (record.format, record.template_version) == (1, TEMPLATE_VERSION)
    code, stdout, _ = cli("check", "-p", str(project))
    assert code == 0 and "up to date" in stdout
    _edit_record(project, lambda d: d.__setitem__("template", "0" * 16))  # templates never shipped
    assert load_record(project).template_version is None
    code, stdout, _ = cli("check", "-p", str(project))
    assert code == 1 and "unreleased templates 0000000000000000" in stdout


def test_a_record_from_the_future_names_both_versions(tmp_path, current_project):
    from scaffold import __version__

    project = tmp_path / NAME
    shutil.copytree(current_project, project)
    _edit_record(project, lambda d: d.update(format=99, scaffold_version="9.0"))
    before = read_tree(tmp_path)
    for command in (["check"], ["upgrade"], ["diff", "upgrade"], ["status"]):
        code, _, stderr = cli(*command, "-p", str(project))
        assert "(9.0, record format 99) than this one" in stderr, (command, stderr)
        assert f"({__version__}, record format 2)" in stderr
        assert code == 2, command  # refused, nothing written
    assert read_tree(tmp_path) == before


def test_templates_from_a_newer_scaffold_are_never_downgraded(tmp_path, current_project):
    from scaffold.versions import TEMPLATE_VERSION

    project = tmp_path / NAME
    shutil.copytree(current_project, project)
    _edit_record(project, lambda d: d.update(template_version=TEMPLATE_VERSION + 1,
                                             template="f" * 16))
    before = read_tree(tmp_path)
    code, _, stderr = cli("upgrade", "-p", str(project))
    assert code == 2 and f"template version {TEMPLATE_VERSION + 1}, newer" in stderr
    code, _, stderr = cli("check", "-p", str(project))
    assert code == 2 and "upgrade scaffold" in stderr
    assert read_tree(tmp_path) == before


def test_check_exit_codes(tmp_path, current_project):
    code, stdout, _ = cli("check", "-p", str(current_project))
    assert code == 0 and stdout.startswith("up to date: template version")
    code, _, stderr = cli("check", "-p", str(tmp_path))  # not a project
    assert code == 2 and "was not generated by scaffold" in stderr
    project = tmp_path / NAME
    shutil.copytree(current_project, project)
    (project / ".scaffold" / "record.json").write_text("{")
    code, _, stderr = cli("check", "-p", str(project))
    assert code == 2 and "is damaged" in stderr and "\n" not in stderr.strip()


def test_upgrading_to_the_same_version_changes_nothing_and_says_so(tmp_path, current_project):
    project = tmp_path / NAME
    shutil.copytree(current_project, project)
    (project / "train.py").write_text((project / "train.py").read_text() + "# mine\n")
    before = read_tree(tmp_path)
    code, stdout, _ = cli("upgrade", "-p", str(project))
    assert code == 0 and "already at template version" in stdout and "nothing to do" in stdout
    code, stdout, stderr = cli("diff", "upgrade", "-p", str(project))
    assert code == 0 and stdout == "" and "no changes" in stderr
    assert read_tree(tmp_path) == before


# --- real upgrades: templates of an earlier commit -> today's -------------------------------

REAL_PROJECTS = {
    "minimal": ("image-classification", []),
    "all": ("image-classification",
            ["amp", "grad-accum", "resume", "callbacks", "early-stopping", "tensorboard",
             "compile", "ddp"]),
    "text": ("text-classification", []),
    "token": ("token-classification", ["amp"]),
}


def insert_in_stable_region(old: bytes, new: bytes, line: bytes) -> tuple[bytes, bytes]:
    """Insert `line` into `old` and `new` at the same place, inside a run of at least 9 lines
    the two versions share (so that the merge cannot be confused): (edited old, expected new)."""
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    blocks = [m for m in difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks()
              if m.size >= 9]
    assert blocks, "no stable region to edit"
    block = max(blocks, key=lambda m: m.size)
    i, j = block.a + block.size // 2, block.b + block.size // 2
    return b"".join(a[:i] + [line] + a[i:]), b"".join(b[:j] + [line] + b[j:])


@pytest.mark.parametrize("old_version", OLD_VERSIONS)
@pytest.mark.parametrize("kind", list(REAL_PROJECTS))
def test_a_real_upgrade_keeps_edits_and_applies_the_template(tmp_path, tmp_path_factory, kind,
                                                             old_version):
    from scaffold.record import load_record
    from scaffold.answers import Answers
    from scaffold.render import render, template_fingerprint
    from scaffold.versions import TEMPLATE_VERSION

    task, features = REAL_PROJECTS[kind]
    old_templates = _old_templates(old_version, tmp_path_factory)
    project = write_project(tmp_path / NAME, task, features, templates=old_templates)
    assert load_record(project).template_version == old_version
    if kind == "minimal":  # as the scaffold of that time wrote it: record format 1
        _edit_record(project, lambda d: (d.pop("template_version"), d.__setitem__("format", 1)))
        assert load_record(project).template_version == old_version
    old_files = project_files(project)
    new_files = generated(render(Answers(NAME, task, features)))
    if old_files == new_files:
        pytest.skip(f"template version {old_version} renders this project as today's templates do")

    # The user's edits: a line in the middle of the loop, and a helper of their own.
    expected = dict(new_files)
    edited, expected["train.py"] = insert_in_stable_region(
        old_files["train.py"], new_files["train.py"], b"# my edit: keep this line\n")
    (project / "train.py").write_bytes(edited)
    helper = b"\n\ndef my_helper():\n    return 42\n"
    (project / "model.py").write_bytes(old_files["model.py"] + helper)
    expected["model.py"] = new_files["model.py"] + helper
    commit_all(project)

    code, stdout, _ = cli("check", "-p", str(project))
    assert code == 1 and f"version {old_version} -> version {TEMPLATE_VERSION}" in stdout
    code, patch, _ = cli("diff", "upgrade", "-p", str(project))
    changed = [p for p in sorted(set(old_files) | set(new_files))
               if old_files.get(p) != new_files.get(p)]
    assert code == 0 and all(f"b/{p}" in patch or f"a/{p}" in patch for p in changed), changed

    code, stdout, stderr = cli("upgrade", "-p", str(project))
    assert code == 0, stdout + stderr
    assert f"upgraded from template version {old_version} to version {TEMPLATE_VERSION}" in stdout
    assert project_files(project) == expected
    record = load_record(project)
    assert record.template_version == TEMPLATE_VERSION
    assert record.template == template_fingerprint()
    assert generated(record.pristine) == new_files
    code, stdout, _ = cli("check", "-p", str(project))
    assert code == 0, stdout
    commit_all(project, "upgraded")
    before = read_tree(project)
    code, stdout, _ = cli("upgrade", "-p", str(project))
    assert code == 0 and "nothing to do" in stdout and read_tree(project) == before


def test_an_edited_loss_line_that_moved_to_model_py_is_a_conflict_not_a_loss(tmp_path,
                                                                            tmp_path_factory):
    """Version 28 moved the loop's loss into model.py (compute_loss, summed_loss): a user who
    had edited that line in train.py gets one conflict there, their line and the new call side
    by side, and every other file upgraded; nothing is dropped silently."""
    old_templates = _old_templates(27, tmp_path_factory)
    project = write_project(tmp_path / NAME, templates=old_templates)
    train = project / "train.py"
    old = "                loss = F.cross_entropy(logits, targets)\n"
    mine = "                loss = F.cross_entropy(logits, targets, label_smoothing=0.1)\n"
    assert train.read_text().count(old) == 1
    train.write_text(train.read_text().replace(old, mine))
    commit_all(project)
    code, stdout, stderr = cli("upgrade", "-p", str(project))
    assert code == 1 and "train.py: 1 conflict" in stdout, stdout + stderr
    merged = train.read_text()
    yours = merged.split("<<<<<<< yours\n")[1].split("||||||| base\n")[0]
    theirs = merged.split("=======\n")[1].split(">>>>>>> theirs\n")[0]
    assert "label_smoothing=0.1" in yours and "compute_loss(model, batch, loss_args)" in theirs
    assert "def compute_loss(model, batch, loss_args: dict):" in (project / "model.py").read_text()


@pytest.mark.slow
def test_the_upgraded_project_passes_its_own_tests(tmp_path, tmp_path_factory):
    """The real CLI (a subprocess) upgrades an edited project; then its own pytest suite runs."""
    from scaffold.answers import Answers
    from scaffold.render import render

    old_templates = _old_templates(OLD_VERSIONS[0], tmp_path_factory)
    project = write_project(tmp_path / NAME, templates=old_templates)
    train = project / "train.py"
    new = generated(render(Answers(NAME)))["train.py"]
    edited, expected = insert_in_stable_region(train.read_bytes(), new, b"# my edit\n")
    train.write_bytes(edited)
    commit_all(project)
    proc = subprocess.run([sys.executable, "-m", "scaffold", "upgrade"], cwd=project,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert train.read_bytes() == expected
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"],
                          cwd=project, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


# --- synthetic template changes --------------------------------------------------------------

CHANGED_LINE = ("    weight_decay: float = 0.01", "    weight_decay: float = 0.05")


@pytest.fixture(scope="module")
def next_templates(tmp_path_factory):
    """Today's templates with one change of each kind, as a version TEMPLATE_VERSION + 1."""
    from scaffold.render import template_dir
    from scaffold.upgrade import installed
    from scaffold.versions import TEMPLATE_VERSION, Migration

    root = tmp_path_factory.mktemp("next") / "templates"
    shutil.copytree(template_dir(), root, ignore=shutil.ignore_patterns("__pycache__"))
    project = root / "project"
    train = project / "train.py.jinja"
    text = train.read_text()
    assert CHANGED_LINE[0] in text, "the synthetic change needs this line of train.py.jinja"
    train.write_text(text.replace(*CHANGED_LINE, 1))
    (project / "NOTES.md.jinja").write_text("# {{ project_name }}: notes\n")  # a new file
    (project / ".gitignore.jinja").unlink()  # a removed file
    (project / "requirements.txt.jinja").rename(project / "requirements-train.txt.jinja")
    renamed = 0
    for path in root.rglob("*.jinja"):  # a renamed Config field and flag (features, tasks too)
        text = path.read_text()
        new = (text.replace("log_every", "log_interval").replace("--log-every", "--log-interval")
               .replace("requirements.txt", "requirements-train.txt"))
        if new != text:
            path.write_text(new)
            renamed += 1
    assert renamed >= 2
    target = installed(root, version=TEMPLATE_VERSION + 1)
    target.migrations = [
        Migration(TEMPLATE_VERSION + 1, "rename_flag", "log_every", "log_interval"),
        Migration(TEMPLATE_VERSION + 1, "rename_file", "requirements.txt",
                  "requirements-train.txt"),
    ]
    return target


def _user_edits(project: Path) -> None:
    train = project / "train.py"
    text = train.read_text()
    text = text.replace("    log_every: int = 10", "    log_every: int = 5", 1)  # uses the flag
    text += "\n# my note at the end\n"
    train.write_text(text)
    req = project / "requirements.txt"
    req.write_text(req.read_text() + "my-extra-package\n")


def test_synthetic_upgrade_applies_every_kind_of_change_and_keeps_edits(tmp_path, next_templates):
    from scaffold.record import load_record
    from scaffold.upgrade import upgrade_project

    project = write_project(tmp_path / NAME)
    _user_edits(project)
    (project / "mine.py").write_text("from train import Config\n\nprint(Config().log_every)\n")
    commit_all(project)
    lines = []
    result = upgrade_project(project, echo=lines.append, target=next_templates)
    output = "\n".join(lines)
    assert result.change.conflicts == [] and result.change.written, output
    train = (project / "train.py").read_text()
    assert CHANGED_LINE[1] in train and CHANGED_LINE[0] not in train  # the template's change
    assert "    log_interval: int = 5" in train and "log_every" not in train  # edit kept, renamed
    assert train.endswith("\n# my note at the end\n")
    assert (project / "NOTES.md").read_text() == f"# {NAME}: notes\n"  # new file
    assert not (project / ".gitignore").exists()  # removed, unedited: deleted
    assert not (project / "requirements.txt").exists()  # renamed, with the edit
    assert (project / "requirements-train.txt").read_text().endswith("my-extra-package\n")
    assert "--log-interval" in (project / "tests" / "conftest.py").read_text()
    assert "migration: renamed Config field log_every -> log_interval" in output
    assert "migration: renamed file requirements.txt -> requirements-train.txt" in output
    assert "note: your mine.py uses log_every" in output  # not generated: listed, not changed
    assert "log_every" in (project / "mine.py").read_text()
    record = load_record(project)
    assert record.template_version == next_templates.version
    assert record.template == next_templates.fingerprint
    assert "NOTES.md" in record.pristine and ".gitignore" not in record.pristine
    compile((project / "train.py").read_text(), "train.py", "exec")


def test_synthetic_upgrade_conflicts_when_both_changed_the_same_lines(tmp_path, next_templates):
    from scaffold.upgrade import upgrade_project

    project = write_project(tmp_path / NAME)
    train = project / "train.py"
    train.write_text(train.read_text().replace(*[CHANGED_LINE[0], "    weight_decay: float = 0.1"]))
    gitignore = project / ".gitignore"
    gitignore.write_text(gitignore.read_text() + "my-data/\n")  # the template removes this file
    commit_all(project)
    lines = []
    result = upgrade_project(project, echo=lines.append, target=next_templates)
    output = "\n".join(lines)
    conflicts = result.change.conflicts
    assert any(c.startswith("train.py: 1 conflict") for c in conflicts), output
    assert any(c.startswith(".gitignore: the change removes this file") for c in conflicts)
    assert "with 1 conflict(s): resolve the markers" in output and result.change.exit_code == 1
    text = train.read_text()
    assert "<<<<<<< yours\n    weight_decay: float = 0.1  #" in text and CHANGED_LINE[1] in text
    assert gitignore.read_text().endswith("my-data/\n")  # kept: nothing lost
    # The next upgrade refuses to run over the markers (so does add feature).
    before = read_tree(project)
    with pytest.raises(ScaffoldError, match="unresolved conflict markers"):
        upgrade_project(project, allow_dirty=True, echo=quiet, target=next_templates)
    code, _, stderr = cli("add", "feature", "amp", "-p", str(project), "--allow-dirty")
    assert code == 2 and "unresolved conflict markers" in stderr
    assert read_tree(project) == before


def test_dry_run_writes_nothing_and_dirty_git_is_refused(tmp_path, next_templates):
    from scaffold.upgrade import upgrade_project

    project = write_project(tmp_path / NAME)
    _user_edits(project)  # not committed
    before = read_tree(tmp_path)
    with pytest.raises(ScaffoldError, match="uncommitted changes to tracked files"):
        upgrade_project(project, echo=quiet, target=next_templates)
    lines = []
    result = upgrade_project(project, dry_run=True, echo=lines.append, target=next_templates)
    assert read_tree(tmp_path) == before and not result.change.written
    assert any(line.startswith("dry run: template version") for line in lines)
    assert any("+    weight_decay: float = 0.05" in line for line in lines)


def test_outside_git_the_changed_files_are_backed_up(tmp_path, next_templates):
    from scaffold.upgrade import upgrade_project

    project = write_project(tmp_path / NAME, in_git=False)
    _user_edits(project)
    edited = project_files(project)
    result = upgrade_project(project, echo=quiet, target=next_templates)
    assert result.change.backup is not None
    backed_up = {p: (result.change.backup / p).read_bytes()
                 for p in ("train.py", "requirements.txt", ".gitignore")}
    assert backed_up == {p: edited[p] for p in backed_up}


def test_diff_upgrade_is_the_template_change_for_these_answers(tmp_path, next_templates):
    from scaffold.upgrade import upgrade_diff

    project = write_project(tmp_path / NAME, in_git=False)
    _user_edits(project)
    before = read_tree(tmp_path)
    migrations, patch = upgrade_diff(project, target=next_templates)
    assert read_tree(tmp_path) == before
    assert migrations == ["renamed Config field log_every -> log_interval "
                          "(--log-every -> --log-interval)",
                          "renamed file requirements.txt -> requirements-train.txt"]
    assert f"\n-{CHANGED_LINE[0]}  #" in patch and f"\n+{CHANGED_LINE[1]}  #" in patch
    assert "--- /dev/null\n+++ b/NOTES.md\n" in patch
    assert "--- a/.gitignore\n+++ /dev/null\n" in patch
    assert "rename from requirements.txt\nrename to requirements-train.txt\n" in patch
    assert "my-extra-package" not in patch and "my note" not in patch  # your edits play no part


def test_an_upgrade_killed_at_any_moment_leaves_the_old_or_the_new_project(
        tmp_path, next_templates):
    from scaffold.merge import project_status
    from scaffold.upgrade import upgrade_project

    old_project = write_project(tmp_path / "old", in_git=False)
    _user_edits(old_project)
    old = read_tree(old_project, skip_backups=True)

    def upgrade(project):
        return lambda: upgrade_project(project, echo=quiet, target=next_templates)

    upgrade_project(old_project, dry_run=True, echo=quiet, target=next_templates)  # renders
    new_project = tmp_path / "new"
    shutil.copytree(old_project, new_project)
    operations = file_operations(upgrade(new_project))
    new = read_tree(new_project)
    assert new != old and b"log_interval: int = 5" in new["train.py"]
    for k in kill_points(operations):
        project = tmp_path / f"k{k}"
        shutil.copytree(old_project, project)
        status = run_and_signal(upgrade(project), k, signal.SIGKILL)
        assert status == -signal.SIGKILL, (k, status)
        project_status(project)  # the next command: finishes or undoes the write, under the lock
        state = read_tree(project)
        assert state in (old, new), f"killed at operation {k}"
    # Ctrl-C while the files are being written waits until all of them are.
    project = tmp_path / "ctrl-c"
    shutil.copytree(old_project, project)
    commit = next(i for i, op in enumerate(operations) if op.endswith("journal.part"))
    assert run_and_signal(upgrade(project), commit + 2, signal.SIGINT) == 0
    assert read_tree(project) == new
