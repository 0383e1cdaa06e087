"""Hostile input (issue 10): every refusal is one line, nothing is half-written, nothing runs.

- names and answers: property tests over arbitrary strings; what is accepted lands only as data
- destinations: files, symbolic links (as the destination or inside it), missing parents, unsafe
  file names
- the record (`.scaffold/record.json`, `pristine.json`, `journal.json`) missing, truncated,
  hand-edited into nonsense, or from a newer scaffold: one line that says what to do
- interrupts: a real SIGKILL / SIGINT at every file operation of `scaffold new` and
  `scaffold add feature` (forked children), and at random moments of the real CLI
- the templates run no code at render time (no copier tasks, migrations or extensions)
- the generated scripts: every Config field refuses bad values naming the flag, and a checkpoint
  carrying a pickled payload is refused without running it
- README's table of refusals matches the messages in the code

Renders are slow on a loaded machine, so one render is shared by the module and the property
tests that render are limited to a few examples; the cheap validators get hundreds.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import pathlib
import random
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from conftest import REPO, scaffold_cli
from scaffold.catalogue import FEATURES, TASKS
from scaffold.cli import app
from scaffold.errors import ScaffoldError, UsageError
from scaffold.lock import project_lock
from scaffold.answers import NAME_RE, Answers, check_description, check_name
from scaffold.record import PRISTINE_FILE, RECORD_FILE
from scaffold.render import project_files
from scaffold.write import JOURNAL_FILE, STAGING_DIR, recover, write_files, write_new_project

try:
    import scaffold.merge  # noqa: F401  (written by another issue; its tests join in once it exists)

    HAVE_MERGE = True
except ImportError:
    HAVE_MERGE = False

PLACEHOLDER_NAME = "Zq-placeholder-name"
PLACEHOLDER_DESC = "Zq placeholder description"
NASTY = [
    '"""', "'''", "\\", "'", '"', "\n", "\r", "\x00", "\x1b[31m", "\u2028", "\u0085", "\u202e",
    "\ud800", "{{", "}}", "{%", "{#", "#}", "%}", "${x}", "$(touch x)", "`id`", "; rm -rf ~",
    "../", "/etc/passwd", "C:\\x", "__import__('os').system('x')", "#", "<!--", "-->", "\t", " ",
    "é", "日本", "🙂", "\u200d", "\ufeff",
]
hostile_text = st.lists(st.sampled_from(NASTY) | st.text(max_size=8), max_size=12).map("".join)


# --- shared renders --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def copier_calls():
    return []


@pytest.fixture(scope="module")
def rendered(copier_calls):
    """The default project with placeholder answers, rendered once, through a spy on copier."""
    import copier

    real = copier.run_copy

    def spy(*args, **kwargs):
        copier_calls.append(kwargs)
        return real(*args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(copier, "run_copy", spy)
        return project_files(Answers(project_name=PLACEHOLDER_NAME, description=PLACEHOLDER_DESC))


def read_tree(root: Path, skip_backups: bool = True) -> dict[str, bytes]:
    """Every file under `root` (relative posix path -> bytes), symbolic links as 'LINK->target'."""
    files = {}
    for path in sorted(Path(root).rglob("*")):
        rel = path.relative_to(root).as_posix()
        if skip_backups and rel.startswith(".scaffold/backup-"):
            continue
        if path.is_symlink():
            files[rel] = b"LINK->" + os.readlink(path).encode()
        elif path.is_file():
            files[rel] = path.read_bytes()
    return files


def assert_one_line_error(stderr: str, exit_code: int, expected_codes=(1, 2)) -> str:
    text = stderr.strip()
    assert exit_code in expected_codes, (exit_code, stderr)
    assert "Traceback" not in stderr, stderr
    assert text.startswith("error: ") and "\n" not in text, repr(stderr)
    return text


def cli(*args: str):
    """The CLI in this process (no start-up cost): (exit code, stdout, stderr)."""
    result = CliRunner().invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


# --- names and answers -----------------------------------------------------------------------

SAFE_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


@settings(max_examples=100, deadline=None)
@given(st.text() | hostile_text | st.from_regex(NAME_RE, fullmatch=True))
def test_any_project_name_is_accepted_only_if_it_is_inert(name):
    """A name reaches Python (a docstring) and shell (#SBATCH) unescaped: only inert characters."""
    try:
        check_name(name)
    except UsageError as exc:
        message = str(exc)
        assert message.startswith("invalid project name") and "\n" not in message
        assert len(message) < 300
        return
    assert 1 <= len(name) <= 64 and set(name) <= SAFE_NAME_CHARS and name[0].isalpha()


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=300) | hostile_text)
def test_any_description_is_one_printable_line_or_refused(text):
    try:
        check_description(text)
    except UsageError as exc:
        assert str(exc).startswith("invalid description") and "\n" not in str(exc)
        return
    assert len(text) <= 200 and "".join(text.splitlines()) == text  # no line break of any kind
    assert not any(d in text for d in ("{{", "}}", "{%", "%}", "{#", "#}"))
    text.encode("utf-8")  # no lone surrogates
    assert not any(c in text for c in "\x00\x1b\u202e\ufeff")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


@settings(max_examples=60, deadline=None)
@given(
    task=st.sampled_from(list(TASKS)) | json_values,
    features=st.lists(st.sampled_from(list(FEATURES)) | st.text(max_size=12), max_size=4)
    | json_values,
)
def test_any_task_and_features_are_validated_or_refused(task, features):
    """What a hand-edited record may hold: any JSON value. Accepted only if in the catalogue."""
    try:
        answers = Answers(project_name="p", task=task, features=features).validated()
    except UsageError as exc:
        assert "\n" not in str(exc)
        return
    assert answers.task in TASKS and set(answers.features) <= set(FEATURES)


def _tree(source, name=None, description=None) -> str:
    """The syntax tree of `source`, with the placeholders replaced inside string constants."""
    tree = ast.parse(source)
    if name is not None:
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                node.value = node.value.replace(PLACEHOLDER_NAME, name)
                node.value = node.value.replace(PLACEHOLDER_DESC, description)
    return ast.dump(tree)


def assert_only_as_data(files, baseline, name, description):
    """`files` (rendered with name/description) is `baseline` (rendered with the placeholders)
    with the placeholders replaced: in Python files inside string constants of the same syntax
    tree (so no code was injected), in every other file byte for byte."""
    assert set(files) == set(baseline)
    for path, data in files.items():
        if path.startswith(".scaffold/"):
            continue
        if path.endswith(".py"):
            try:
                compile(data, path, "exec", dont_inherit=True)
            except SyntaxError as exc:
                raise AssertionError(f"{path} does not compile: {exc}") from None
            assert _tree(data) == _tree(baseline[path], name, description), (
                f"{path}: the syntax tree changed: an answer was rendered as code"
            )
        else:
            expected = baseline[path].replace(PLACEHOLDER_NAME.encode(), name.encode())
            expected = expected.replace(PLACEHOLDER_DESC.encode(), description.encode())
            assert data == expected, f"{path}: an answer did not land as plain text"
    answers = json.loads(files[RECORD_FILE])["answers"]
    assert (answers["project_name"], answers["description"]) == (name, description)


def accepted(strategy, check):
    def ok(value):
        try:
            check(value)
        except UsageError:
            return False
        return True

    return strategy.filter(ok)


@settings(
    max_examples=1, deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    name=st.from_regex(NAME_RE, fullmatch=True),
    description=accepted(hostile_text, check_description),
)
@example(
    name="Z.-_9" * 12 + "Zzzz",
    description='""" + __import__("os").system("touch pwned") + """ \\ \' # $(touch x) `id` '
    "<!-- x --> é 日本 🙂 ${HOME} %s {0} ../../etc/passwd",
)
def test_accepted_answers_land_only_as_data(rendered, name, description):
    files = project_files(Answers(project_name=name, description=description))
    assert_only_as_data(files, rendered, name, description)


def test_the_data_check_catches_an_injection():
    """assert_only_as_data fails when an answer turns into code (so the test above can fail)."""

    def project(name, description, python):
        answers = {"project_name": name, "description": description}
        return {"x.py": python, "README.md": f"# {name}\n{description}\n".encode(),
                RECORD_FILE: json.dumps({"answers": answers}).encode()}

    base = project(PLACEHOLDER_NAME, PLACEHOLDER_DESC, f'"""Doc: {PLACEHOLDER_NAME}."""\nA = 1\n'.encode())
    name = 'x."""\nimport os\n"""'
    injected = project(name, "d", f'"""Doc: {name}."""\nA = 1\n'.encode())
    with pytest.raises(AssertionError, match="syntax tree changed"):
        assert_only_as_data(injected, base, name, "d")
    broken = project("y", "d", b'"""Doc: y"""."""\nA = 1\n')
    with pytest.raises(AssertionError, match="does not compile"):
        assert_only_as_data(broken, base, "y", "d")
    escaped = project("y", "d&amp;", b'"""Doc: y."""\nA = 1\n')
    escaped["README.md"] = b"# y\nd&amp;amp;\n"
    with pytest.raises(AssertionError, match="plain text"):
        assert_only_as_data(escaped, base, "y", "d&amp;")
    assert_only_as_data(project("y", "d", b'"""Doc: y."""\nA = 1\n'), base, "y", "d")


def test_free_text_reaches_code_only_through_a_safe_filter():
    """In the templates, the description may appear in Markdown only, or through `tojson` (a
    valid Python string literal); the project name is restricted to NAME_RE (see above)."""
    for template in (REPO / "templates" / "project").rglob("*.jinja"):
        text = template.read_text()
        for expr in re.findall(r"\{\{(.*?)\}\}", text, flags=re.S):
            if "description" in expr and "tojson" not in expr:
                assert template.name.endswith(".md.jinja"), (template, expr)


# --- the templates run no code ---------------------------------------------------------------


def test_templates_run_no_code_at_render_time(rendered, copier_calls):
    import yaml

    questions = yaml.safe_load((REPO / "templates" / "copier.yml").read_text())
    for key in ("_tasks", "_migrations", "_jinja_extensions", "_external_data"):
        assert key not in questions, key
    assert copier_calls and all(c["unsafe"] is False and c["skip_tasks"] for c in copier_calls)
    assert "train.py" in rendered  # ... and rendering works that way


def test_a_template_that_wants_to_run_code_is_refused(tmp_path, monkeypatch):
    """Defence in depth, should someone edit copier.yml: a Jinja extension (Python imported at
    render time) makes rendering fail (tasks are skipped: see the test above)."""
    from scaffold import render as render_mod

    copy = tmp_path / "templates"
    shutil.copytree(REPO / "templates", copy)
    questions = (copy / "copier.yml").read_text()
    monkeypatch.setattr(render_mod, "template_dir", lambda: copy)
    (copy / "copier.yml").write_text(questions + "\n_jinja_extensions:\n  - os.path\n")
    with pytest.raises(ScaffoldError, match="rendering the template failed"):
        render_mod.render(Answers(project_name="p"))


# --- destinations ----------------------------------------------------------------------------


@pytest.fixture
def fast_render(monkeypatch, rendered):
    """`scaffold new` with the shared render (every refusal below happens before or after it)."""
    monkeypatch.setattr("scaffold.project.project_files", lambda answers: dict(rendered))


def _dest_file(tmp):
    (tmp / "p").write_text("mine")
    return tmp / "p", "exists and is not a directory"


def _dest_link_to_dir(tmp):
    (tmp / "real").mkdir()
    (tmp / "p").symlink_to(tmp / "real")
    return tmp / "p", "is a symbolic link"


def _dest_dangling_link(tmp):
    (tmp / "p").symlink_to(tmp / "nowhere")
    return tmp / "p", "is a symbolic link"


def _dest_no_parent(tmp):
    return tmp / "missing" / "p", "is not an existing directory"


def _dest_parent_is_file(tmp):
    (tmp / "f").write_text("mine")
    return tmp / "f" / "p", "is not an existing directory"


def _dest_link_loop(tmp):
    (tmp / "loop").symlink_to(tmp / "loop")
    return tmp / "loop" / "p", "cannot use"


def _dest_bad_name(tmp):
    return tmp / "bad\nname", "invalid project name 'bad\\nname'"


@pytest.mark.parametrize(
    "make",
    [_dest_file, _dest_link_to_dir, _dest_dangling_link, _dest_no_parent, _dest_parent_is_file,
     _dest_link_loop, _dest_bad_name],
)
def test_bad_destinations_are_refused_and_nothing_is_written(tmp_path, fast_render, make):
    dest, message = make(tmp_path)
    before = read_tree(tmp_path)
    code, _, stderr = cli("new", str(dest), "--defaults")
    line = assert_one_line_error(stderr, code)
    assert message in line
    assert read_tree(tmp_path) == before


@pytest.mark.parametrize(
    "link, target_is_dir",
    [(".scaffold", True), ("train.py", False), ("tests", True), ("tests/conftest.py", False)],
)
def test_force_never_writes_through_a_symbolic_link(tmp_path, fast_render, link, target_is_dir):
    dest, outside = tmp_path / "p", tmp_path / "outside"
    dest.mkdir()
    (dest / "notes.txt").write_text("mine")
    if target_is_dir:
        outside.mkdir()
    else:
        outside.write_text("precious")
    (dest / link).parent.mkdir(parents=True, exist_ok=True)
    (dest / link).symlink_to(outside)
    before = read_tree(tmp_path)
    code, _, stderr = cli("new", str(dest), "--defaults", "--force")
    assert "is a symbolic link" in assert_one_line_error(stderr, code)
    assert read_tree(tmp_path) == before


def test_force_refuses_a_directory_in_the_way(tmp_path, fast_render):
    dest = tmp_path / "p"
    (dest / "train.py").mkdir(parents=True)
    before = read_tree(tmp_path)
    code, _, stderr = cli("new", str(dest), "--defaults", "--force")
    assert "is a directory; move it away" in assert_one_line_error(stderr, code)
    assert read_tree(tmp_path) == before


@pytest.mark.parametrize(
    "rel", ["../evil.py", "/tmp/evil.py", "a/../../evil.py", "", ".", "a//b", "a\\b", "x\0y", "ok/\n"]
)
def test_unsafe_file_names_are_never_written(tmp_path, rel):
    root = tmp_path / "project"
    root.mkdir()
    with pytest.raises(ScaffoldError, match="not a relative path inside the project"):
        write_files(root, {"fine.txt": b"x", rel: b"evil"})
    assert read_tree(tmp_path) == {}


def test_a_symbolic_link_destination_is_refused_by_the_real_cli(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "p").symlink_to(tmp_path / "real")
    result = scaffold_cli("new", "p", "--defaults", cwd=tmp_path)
    assert "is a symbolic link" in assert_one_line_error(result.stderr, result.returncode)
    assert list((tmp_path / "real").iterdir()) == []


# --- the record ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def clean_project(tmp_path_factory, rendered):
    dest = tmp_path_factory.mktemp("clean") / "p"
    write_new_project(dest, rendered)
    return dest


def _edit_json(rel, change):
    def corrupt(project: Path):
        path = project / rel
        data = json.loads(path.read_text())
        change(data)
        path.write_text(json.dumps(data))

    return corrupt


def _write(rel, data: bytes):
    def corrupt(project: Path):
        (project / rel).write_bytes(data)

    return corrupt


def _truncate(rel):
    def corrupt(project: Path):
        data = (project / rel).read_bytes()
        (project / rel).write_bytes(data[: len(data) // 2])

    return corrupt


def _delete(rel):
    def corrupt(project: Path):
        path = project / rel
        shutil.rmtree(path) if path.is_dir() else path.unlink()

    return corrupt


def _traversal(project: Path):
    """A hand-edited record that names a file outside the project, consistently in both files."""
    import hashlib

    evil = b"import os\n"
    for rel, key in ((RECORD_FILE, "files"), (PRISTINE_FILE, None)):
        data = json.loads((project / rel).read_text())
        if key:
            data[key]["../../evil.py"] = hashlib.sha256(evil).hexdigest()
        else:
            data["../../evil.py"] = evil.decode()
        (project / rel).write_text(json.dumps(data))


def _absolute(project: Path):
    data = json.loads((project / RECORD_FILE).read_text())
    data["files"]["/etc/passwd"] = "0" * 64
    (project / RECORD_FILE).write_text(json.dumps(data))


def _symlink_to_device(project: Path):
    (project / RECORD_FILE).unlink()
    (project / RECORD_FILE).symlink_to("/dev/zero")


def _record_is_a_directory(project: Path):
    (project / RECORD_FILE).unlink()
    (project / RECORD_FILE).mkdir()


def _journal(ops):
    def corrupt(project: Path):
        (project / JOURNAL_FILE).write_text(json.dumps(ops))

    return corrupt


def _set(key, value):
    return _edit_json(RECORD_FILE, lambda d: d.__setitem__(key, value))


def _answer(key, value):
    return _edit_json(RECORD_FILE, lambda d: d["answers"].__setitem__(key, value))


RESTORE = "restore .scaffold/ from version control"
CORRUPTIONS = {
    "no .scaffold at all": (_delete(".scaffold"), "was not generated by scaffold"),
    "record missing": (_delete(RECORD_FILE), "was not generated by scaffold"),
    "record truncated": (_truncate(RECORD_FILE), RESTORE),
    "record empty": (_write(RECORD_FILE, b""), RESTORE),
    "record not utf-8": (_write(RECORD_FILE, b"\xff\xfe{}"), RESTORE),
    "record a list": (_write(RECORD_FILE, b"[1, 2]"), RESTORE),
    "record nested deeply": (_write(RECORD_FILE, b"[" * 100000 + b"]" * 100000), RESTORE),
    "record is a directory": (_record_is_a_directory, RESTORE),
    "record links to a device": (_symlink_to_device, RESTORE),
    "newer format": (_set("format", 99), "upgrade scaffold"),
    "format missing": (_edit_json(RECORD_FILE, lambda d: d.pop("format")), RESTORE),
    "format a string": (_set("format", "1"), RESTORE),
    "format true": (_set("format", True), RESTORE),
    "answers a string": (_set("answers", "amp"), RESTORE),
    "answers missing": (_edit_json(RECORD_FILE, lambda d: d.pop("answers")), RESTORE),
    "answers with extra key": (_answer("evil", 1), RESTORE),
    "features a string": (_answer("features", "amp"), RESTORE),
    "features numbers": (_answer("features", [1, 2]), RESTORE),
    "unknown feature": (_answer("features", ["warp-drive"]), RESTORE),
    "unknown task": (_answer("task", "speech"), RESTORE),
    "task a list": (_answer("task", ["image-classification"]), RESTORE),
    "name traversal": (_answer("project_name", "../../x"), RESTORE),
    "name absolute": (_answer("project_name", "/etc/passwd"), RESTORE),
    "description code": (_answer("description", "{{ cycler.__init__.__globals__ }}"), RESTORE),
    "files a list": (_set("files", ["train.py"]), RESTORE),
    "hash a number": (_edit_json(RECORD_FILE, lambda d: d["files"].__setitem__("train.py", 1)), RESTORE),
    "file outside the project": (_traversal, "names an unsafe path"),
    "absolute file name": (_absolute, "names an unsafe path"),
    "pristine missing": (_delete(PRISTINE_FILE), RESTORE),
    "pristine truncated": (_truncate(PRISTINE_FILE), RESTORE),
    "pristine a list": (_write(PRISTINE_FILE, b"[]"), RESTORE),
    "pristine values numbers": (_edit_json(PRISTINE_FILE, lambda d: d.__setitem__("train.py", 5)), RESTORE),
    "pristine lone surrogate": (_write(PRISTINE_FILE, b'{"train.py": "\\ud800"}'), RESTORE),
    "pristine hand-edited": (
        _edit_json(PRISTINE_FILE, lambda d: d.__setitem__("train.py", d["train.py"] + "# x\n")),
        "does not match",
    ),
    "pristine extra file": (_edit_json(PRISTINE_FILE, lambda d: d.__setitem__("notes.txt", "")), "does not match"),
    "journal nonsense": (_journal({"format": 1, "ops": "x"}), "delete .scaffold/journal.json"),
    "journal traversal": (_journal({"format": 1, "ops": [["../evil.py", "0"]]}), "delete .scaffold/journal.json"),
    "journal not json": (_write(JOURNAL_FILE, b"\x00{"), "delete .scaffold/journal.json"),
}


@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_a_damaged_record_is_one_line_that_says_what_to_do(tmp_path, clean_project, case):
    from scaffold.record import load_record

    corrupt, hint = CORRUPTIONS[case]
    project = tmp_path / "p"
    shutil.copytree(clean_project, project, symlinks=True)
    if "journal" in case:  # a staged file the journal would move
        (project / STAGING_DIR).mkdir()
        (project / STAGING_DIR / "0").write_text("import os  # evil\n")
    corrupt(project)
    before = read_tree(tmp_path)
    with pytest.raises(ScaffoldError) as info:
        recover(project)  # what every command does first, once
        load_record(project)
    message = str(info.value)
    assert "\n" not in message and hint in message, message
    assert read_tree(tmp_path) == before, "a damaged record must change nothing"
    if not HAVE_MERGE:
        return
    for args in (["status", "-p", str(project)], ["add", "feature", "amp", "-p", str(project)]):
        code, stdout, stderr = cli(*args)
        assert hint in assert_one_line_error(stderr, code), args
        assert read_tree(tmp_path) == before, args


def test_a_clean_record_loads(clean_project):
    from scaffold.record import load_record

    record = load_record(clean_project)
    assert record.answers.project_name == PLACEHOLDER_NAME and "train.py" in record.pristine


# --- interrupts ------------------------------------------------------------------------------
#
# A forked child runs the real write code and sends itself a real signal just before its k-th
# file operation (write, rename or delete), for every k; the parent then inspects what is left.

FILE_OPERATIONS = [
    (pathlib.Path, "write_bytes"), (pathlib.Path, "write_text"), (os, "replace"), (os, "unlink"),
]


def _hook_file_operations(before_each):
    for owner, name in FILE_OPERATIONS:
        real = getattr(owner, name)

        def wrapper(*args, _real=real, _name=name, **kwargs):
            before_each(_name, args)
            return _real(*args, **kwargs)

        setattr(owner, name, wrapper)


def file_operations(action) -> list[str]:
    """The file operations `action` does, in order, e.g. 'replace .../journal.part'."""
    seen = []
    saved = [(owner, name, getattr(owner, name)) for owner, name in FILE_OPERATIONS]
    try:
        _hook_file_operations(lambda name, args: seen.append(f"{name} {args[0]}"))
        action()
    finally:
        for owner, name, real in saved:
            setattr(owner, name, real)
    return seen


def kill_points(operations: list[str]) -> list[int]:
    """For a journaled write, the moments that matter (1-based: killed just before operation k):
    the first, around the commit (the journal's rename), the first and last moves, a random
    staging write and move. Every k would cost a fork and a merge each on a loaded machine."""
    commit = 1 + next(i for i, op in enumerate(operations) if op.endswith("journal.part"))
    total = len(operations)
    rng = random.Random()
    picks = {1, commit - 1, commit, commit + 1, commit + 2, total - 1, total,
             rng.randint(1, commit), rng.randint(commit, total)}
    return sorted(k for k in picks if 1 <= k <= total)


def run_and_signal(action, k: int, signum: int) -> int:
    """Fork; the child runs `action` and signals itself before its k-th file operation.
    Returns the child's exit status (negative: killed by that signal)."""
    pid = os.fork()
    if pid == 0:  # the child never returns into pytest
        code = 0
        try:
            count = [0]

            def before_each(name, args):
                count[0] += 1
                if count[0] == k:
                    os.kill(os.getpid(), signum)
                    if signum == signal.SIGKILL:
                        time.sleep(60)

            _hook_file_operations(before_each)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            action()
        except KeyboardInterrupt:
            code = 130
        except BaseException:
            code = 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _visible(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


def test_new_killed_at_every_file_operation_leaves_nothing_or_everything(tmp_path, rendered):
    total = len(file_operations(lambda: write_new_project(tmp_path / "count", rendered)))
    assert total >= len(rendered)
    for k in range(1, total + 2):
        parent = tmp_path / f"k{k}"
        parent.mkdir()
        status = run_and_signal(lambda: write_new_project(parent / "p", rendered), k, signal.SIGKILL)
        assert status == (-signal.SIGKILL if k <= total else 0), (k, status)
        if (parent / "p").exists():
            assert read_tree(parent / "p") == rendered, f"killed at operation {k}: a mix"
        else:
            assert _visible(parent) == [], k
            hidden = [p.name for p in parent.iterdir()]
            assert all(n.startswith(".p.scaffold-partial-") for n in hidden), hidden
            write_new_project(parent / "p", rendered)  # the next run: cleans up, then succeeds
            assert [p.name for p in parent.iterdir()] == ["p"], "a stale staging folder was left"
            assert read_tree(parent / "p") == rendered


def test_new_into_an_empty_folder_killed_at_every_file_operation(tmp_path, rendered):
    (tmp_path / "count").mkdir()
    operations = file_operations(lambda: write_new_project(tmp_path / "count", rendered))
    for k in kill_points(operations):
        dest = tmp_path / f"k{k}"
        dest.mkdir()
        status = run_and_signal(lambda: write_new_project(dest, rendered), k, signal.SIGKILL)
        assert status == -signal.SIGKILL, (k, status)
        with project_lock(dest, write=True, command="status"):  # what the next command does
            pass
        state = read_tree(dest)
        assert state in ({}, rendered), f"killed at operation {k}: a mix of {sorted(state)}"
        assert not (dest / ".scaffold").exists() or state == rendered


def test_ctrl_c_while_files_are_written_waits_for_all_of_them(tmp_path, rendered):
    total = len(file_operations(lambda: write_new_project(tmp_path / "count", rendered)))
    shutil.rmtree(tmp_path / "count")
    for k in sorted({1, total // 2, total}):
        for existing in (False, True):  # a new folder (rename) and an empty one (journal)
            dest = tmp_path / f"k{k}-{existing}"
            if existing:
                dest.mkdir()
            status = run_and_signal(lambda: write_new_project(dest, rendered), k, signal.SIGINT)
            assert status == 0, (k, existing, status)
            assert read_tree(dest) == rendered
            assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_ctrl_c_while_rendering_is_one_line_and_writes_nothing(tmp_path, monkeypatch):
    def interrupted_render(answers):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
        raise AssertionError("SIGINT was not delivered")

    monkeypatch.setattr("scaffold.project.project_files", interrupted_render)
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        code, _, stderr = cli("new", str(tmp_path / "p"), "--defaults")
    finally:
        signal.signal(signal.SIGINT, old)
    assert code == 130 and stderr.strip() == "error: interrupted; no file was changed: run the command again"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not HAVE_MERGE, reason="scaffold.merge (add feature) does not exist yet")
def test_add_feature_killed_at_every_file_operation(tmp_path, clean_project, monkeypatch):
    """Old state or new state (after the next scaffold command finishes a committed write)."""
    from scaffold import render as render_mod
    from scaffold.merge import change_feature, project_status

    cache = {}
    real_render = render_mod.render

    def cached_render(answers):  # forked children reuse the parent's renders
        key = json.dumps(answers.as_data(), sort_keys=True)
        if key not in cache:
            cache[key] = real_render(answers)
        return dict(cache[key])

    monkeypatch.setattr("scaffold.merge.render", cached_render)
    old_project = tmp_path / "old"
    shutil.copytree(clean_project, old_project, symlinks=True)
    train = old_project / "train.py"
    train.write_text(train.read_text().replace("import time\n", "import time  # my edit\n", 1))
    old = read_tree(old_project)

    def add(project):
        return lambda: change_feature(project, "amp", add=True, allow_dirty=True, echo=lambda *a: None)

    change_feature(old_project, "amp", add=True, dry_run=True, echo=lambda *a: None)  # renders
    assert read_tree(old_project) == old
    new_project = tmp_path / "new"
    shutil.copytree(old_project, new_project, symlinks=True)
    operations = file_operations(add(new_project))
    new = read_tree(new_project)
    assert new != old and b"# my edit" in new["train.py"] and b"[amp]" in new["train.py"]
    for k in kill_points(operations):
        project = tmp_path / f"k{k}"
        shutil.copytree(old_project, project, symlinks=True)
        status = run_and_signal(add(project), k, signal.SIGKILL)
        assert status == -signal.SIGKILL, (k, status)
        project_status(project)  # the next command: finishes or undoes the write, under the lock
        state = read_tree(project)
        assert state in (old, new), f"killed at operation {k}: {_mix(state, old, new)}"


def _mix(state, old, new) -> str:
    paths = sorted(set(state) | set(old) | set(new))
    as_old = [p for p in paths if state.get(p) == old.get(p) != new.get(p)]
    as_new = [p for p in paths if state.get(p) == new.get(p) != old.get(p)]
    neither = [p for p in paths if state.get(p) not in (old.get(p), new.get(p))]
    return f"a mix: as before {as_old}, as after {as_new}, neither {neither}"


@pytest.mark.slow
def test_the_real_cli_killed_at_random_moments(tmp_path, rendered):
    """`scaffold new` as a user runs it, hit by SIGKILL or Ctrl-C after a random delay."""
    rng = random.Random()
    for attempt, signum in enumerate([signal.SIGKILL, signal.SIGINT]):
        cwd = tmp_path / f"run{attempt}"
        cwd.mkdir()
        proc = subprocess.Popen(
            [sys.executable, "-m", "scaffold", "new", PLACEHOLDER_NAME, "--defaults",
             "--description", PLACEHOLDER_DESC],
            cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        try:
            proc.wait(timeout=rng.uniform(0.3, 6.0))
        except subprocess.TimeoutExpired:
            proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=120)
        if (cwd / PLACEHOLDER_NAME).exists():
            assert read_tree(cwd / PLACEHOLDER_NAME) == rendered
        else:
            assert _visible(cwd) == [], (signum, stderr)
            if signum == signal.SIGINT and "Traceback" not in stderr:  # past Python's start-up
                assert proc.returncode in (2, 130), stderr


# --- the generated scripts -------------------------------------------------------------------

SCRIPT_PROBE = textwrap.dedent(r'''
    """Run in a fresh interpreter: bad flags for every Config field, and crafted checkpoints."""
    import contextlib, io, json, os, pickle, runpy, sys

    projects, scratch, results_path = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
    a_file = os.path.join(scratch, "a-file")
    open(a_file, "w").close()
    TINY = ["--synthetic-train-size", "16", "--synthetic-val-size", "8", "--batch-size", "8",
            "--max-steps", "1", "--device", "cpu", "--no-compile"]  # every project has all features
    BAD = {bool: ["maybe", ""], int: ["abc", "1.5", "", "-1"], float: ["abc", "nan", "inf", "-1"]}
    BAD_STR = {
        "data_dir": ["/nonexistent/data", a_file],
        "out_dir": [a_file, a_file + "/sub"],
        "device": ["banana", "cpu:banana", "cuda:x", "cuda:", "cuda:-1"],
        "precision": ["fp8", ""],
        "monitor": ["train_loss", "nope"],
        "mode": ["sideways"],
        "resume": [""],
        "arch": [],  # checked when the model is built: see RUNTIME
        "augment": ["flip", "", "CROP"],
        "encoder": ["lstm", "", "Bag"],
        "profile_steps": ["5", "3:3", "0:2", "a:b", "2:1", "1:2:3"],
        "class_weights": ["Balanced", "inverse", "", "balanced "],
    }
    EXTRA = {"dropout": ["1"], "seed": [str(2**64)], "label_smoothing": ["1", "1.5"]}
    # --num-workers -1 means "auto" (0 on CPU): below that is refused
    OWN_BAD = {"num_workers": ["abc", "1.5", "", "-2"]}
    RUNTIME = {"arch": ["no-such-net"], "device": ["cuda:7", "mps"], "resume": ["/nonexistent/x.pt"]}
    results = {"fields": {}, "failures": [], "checkpoints": {}, "seconds": {}}
    import time
    start = time.time()

    def fresh_train(project):
        for name in ("train", "data", "model", "callbacks"):
            sys.modules.pop(name, None)
        sys.path.insert(0, project)
        os.chdir(project)
        import train
        return train

    def parse(train, argv):
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                train.parse_config(argv)
        except SystemExit as exc:
            return exc.code, err.getvalue()
        return 0, err.getvalue()

    def run_main(train, argv):
        out, err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                train.main(argv)
        except SystemExit as exc:
            code = exc.code
            return (code if isinstance(code, int) else 1), (err.getvalue() + str(code or ""))
        except BaseException as exc:
            return "crash", f"{type(exc).__name__}: {exc}"
        return 0, out.getvalue()

    for project in projects:
        train = fresh_train(project)
        results["seconds"]["import " + os.path.basename(project)] = time.time() - start
        fields = train.dataclasses.fields(train.Config)
        assert parse(train, [])[0] == 0, "the defaults must be valid"
        results["fields"][project] = [f.name for f in fields]
        for field in fields:
            flag = train.flag(field.name)
            kind = type(field.default)
            if kind is str and field.name not in BAD_STR:
                results["failures"].append(f"{project}: no bad values listed for {field.name}")
                continue
            bad = BAD_STR[field.name] if kind is str else OWN_BAD.get(field.name, BAD[kind])
            for value in bad + EXTRA.get(field.name, []):
                code, err = parse(train, [f"{flag}={value}"])
                if code != 2 or flag not in err or "Traceback" in err:
                    results["failures"].append(f"{project}: {flag}={value!r}: exit {code}: {err[-300:]!r}")
            for value in RUNTIME.get(field.name, []):
                out_dir = os.path.join(scratch, "runtime-out")
                code, err = run_main(train, TINY + ["--out-dir", out_dir, f"{flag}={value}"])
                trained = os.path.exists(os.path.join(out_dir, "metrics.csv"))
                if code in (0, "crash") or flag not in err or trained:
                    results["failures"].append(f"{project}: {flag}={value!r}: exit {code}: {err[-300:]!r}")
        results["seconds"]["fields " + os.path.basename(project)] = time.time() - start

    # Crafted checkpoints, given to `python train.py --resume PATH` of the last project.
    import torch

    marker = os.path.join(scratch, "payload-ran")

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    state = {"model": Payload(), "optimizer": {}, "scheduler": {}, "step": 0, "epoch": 0, "config": {}}
    crafted = {
        "zip": lambda p: torch.save(state, p),
        "legacy": lambda p: torch.save(state, p, _use_new_zipfile_serialization=False),
        "raw pickle": lambda p: pickle.dump(state, open(p, "wb")),
        "not a dict": lambda p: torch.save([1, 2, 3], p),
        "missing keys": lambda p: torch.save({"model": {}}, p),
        "config not a dict": lambda p: torch.save({**state, "model": {}, "config": "nonsense"}, p),
        "garbage": lambda p: open(p, "wb").write(b"\x80\x04garbage"),
        "empty": lambda p: open(p, "wb").close(),
    }
    for name, make in crafted.items():
        path = os.path.join(scratch, name.replace(" ", "-") + ".pt")
        make(path)
        sys.argv = ["train.py", *TINY, "--out-dir", os.path.join(scratch, "out-" + name), "--resume", path]
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                runpy.run_path("train.py", run_name="__main__")  # exactly `python train.py ...`
            outcome = ("ran", "")
        except SystemExit as exc:
            outcome = (exc.code if isinstance(exc.code, int) else 1, str(exc.code))
        except BaseException as exc:
            outcome = ("crash", f"{type(exc).__name__}: {exc}")
        traceback = "Traceback" in err.getvalue()
        results["checkpoints"][name] = [*outcome, traceback, os.path.exists(marker)]
        results["seconds"]["checkpoint " + name] = time.time() - start
    # The control: the payload is real, it runs when loaded without weights_only.
    torch.load(os.path.join(scratch, "zip.pt"), weights_only=False)
    results["payload_is_real"] = os.path.exists(marker)
    with open(results_path, "w") as f:
        json.dump(results, f)
    sys.stdout.flush()
    os._exit(0)
''')


@pytest.mark.slow
def test_generated_scripts_refuse_bad_flags_and_crafted_checkpoints(tmp_path):
    """Every Config field of every task (all features) refuses bad values with its flag named,
    before training; a checkpoint with a pickled payload is refused and the payload never runs."""
    projects = []
    for name in ("text-classification-all", "token-classification-all", "all"):
        copy = tmp_path / name
        shutil.copytree(REPO / "generated_examples" / name, copy)
        projects.append(str(copy))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT_PROBE)
    results_path = tmp_path / "results.json"
    proc = subprocess.run(
        [sys.executable, str(script), json.dumps(projects), str(scratch), str(results_path)],
        capture_output=True, text=True, timeout=600,
    )
    assert results_path.exists(), proc.stdout[-2000:] + proc.stderr[-3000:]
    results = json.loads(results_path.read_text())
    print(json.dumps(results["seconds"], indent=1))
    assert results["failures"] == []
    assert all(len(fields) > 20 for fields in results["fields"].values())
    assert results["payload_is_real"], "the control: the crafted payload runs without weights_only"
    for name, (code, message, traceback, payload_ran) in results["checkpoints"].items():
        assert not payload_ran, f"{name}: the payload ran"
        assert code not in (0, "ran", "crash") and not traceback, (name, code, message)
        assert message.startswith("error: ") and "\n" not in message and ".pt" in message, message
        assert "cannot load checkpoint" in message or "is not a checkpoint" in message, message
    for name in ("zip", "legacy", "raw pickle"):
        assert "loading those could run code" in results["checkpoints"][name][1], name


def test_generated_code_loads_checkpoints_only_with_weights_only():
    """Every torch.load in every generated example passes weights_only=True; nothing unpickles."""
    calls = 0
    sources = {path.read_text(): path for path in (REPO / "generated_examples").rglob("*.py")}
    for text, path in sources.items():
        if not any(word in text for word in ("torch.load", "import load", "pickle", "marshal", "dill")):
            continue
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert not {"pickle", "dill", "cloudpickle", "marshal"} & set(names), path
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "torch.load":
                calls += 1
                keywords = {k.arg: k.value for k in node.keywords}
                assert "weights_only" in keywords, (path, ast.unparse(node))
                assert ast.literal_eval(keywords["weights_only"]) is True, (path, ast.unparse(node))
    assert calls > 0


# --- README's table of refusals --------------------------------------------------------------

PLACEHOLDER = re.compile(r"<[a-z][a-z0-9 _.-]*>")
CLICK_ERRORS = {  # click's own usage errors (exit 2), produced by these command lines
    "No such option": ["new", "p", "--frobnicate"],
    "Missing argument": ["new"],
    "No such command": ["frobnicate"],
    "Got unexpected extra argument": ["new", "a", "b"],
    "requires an argument": ["new", "p", "--task"],
}


def _template(node) -> str | None:
    """A string or f-string of the source, with each {placeholder} as '<>'."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "<>" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _template(node.left), _template(node.right)
        if left is not None or right is not None:
            return (left if left is not None else "<>") + (right if right is not None else "<>")
    return None


@functools.lru_cache(maxsize=None)
def code_messages():
    """(template, exit code or None) for every message in scaffold/: raised errors with their
    exit code, and every other string (printed lines) with None."""
    messages = []
    for path in sorted((REPO / "scaffold").glob("*.py")):
        tree = ast.parse(path.read_text())
        raised = set()
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("ScaffoldError", "UsageError") and node.args):
                text = _template(node.args[0])
                assert text is not None and text.strip("<>"), f"{path.name}:{node.lineno}: build the message inline"
                messages.append((text, 2))  # a refusal: nothing written
                raised.add(id(node.args[0]))
        for node in ast.walk(tree):
            text = _template(node)
            if text and id(node) not in raised:
                messages.append((text.removeprefix("error: "), None))
    return tuple(messages)


@functools.lru_cache(maxsize=None)
def click_errors() -> dict[str, str]:
    outputs = {}
    for key, args in CLICK_ERRORS.items():
        code, stdout, stderr = cli(*args)
        assert code == 2 and key in stderr, (args, code, stderr)
        outputs[key] = stderr
    return outputs


def _pattern(template: str) -> re.Pattern:
    return re.compile(".*".join(re.escape(part) for part in template.split("<>")), re.S)


def check_refusal_table(markdown: str) -> None:
    rows = []
    for line in markdown.splitlines():
        match = re.match(r"\|\s*`(.+?)`\s*\|\s*(\d+)\s*\|", line.replace("\\|", "\x00"))
        if match:
            rows.append((match.group(1).replace("\x00", "|"), int(match.group(2))))
    assert len(rows) > 30, "no refusal table found"
    messages = code_messages()
    raised = [(t, c) for t, c in messages if c is not None]
    printed = [t for t, c in messages if c is None and len(t.replace("<>", "")) >= 20]
    click_errors()  # each of click's errors is produced, with exit code 2
    covered = set()
    for row, exit_code in rows:
        text = PLACEHOLDER.sub("<>", row)
        matches = [(t, c) for t, c in raised if _pattern(t).fullmatch(text)]
        if matches:
            assert {c for _, c in matches} == {exit_code}, (row, exit_code, matches)
            covered.update(t for t, _ in matches)
        elif any(key in row for key in CLICK_ERRORS):
            assert exit_code == 2, row
        else:
            assert any(_pattern(t).fullmatch(text) for t in printed), f"not in the code: {row!r}"
            assert exit_code in (1, 130), row
    missing = sorted({t for t, _ in raised} - covered)
    assert missing == [], f"refusals missing from the table: {missing}"


def test_readme_lists_every_refusal_with_its_exit_code():
    readme = (REPO / "README.md").read_text()
    start = readme.find("## Refusals")
    assert start >= 0, "README.md has no '## Refusals' section (the table lives in /tmp/refusals.md)"
    end = readme.find("\n## ", start + 1)
    check_refusal_table(readme[start: end if end > 0 else None])


def test_the_refusal_table_check_can_fail():
    table = "\n".join(
        f"| `{t.replace('<>', '<x>').replace('|', chr(92) + '|')}` | {c} | |"
        for t, c in code_messages() if c is not None
    )
    check_refusal_table(table)  # the code's own messages pass
    with pytest.raises(AssertionError, match="missing from the table"):
        check_refusal_table("\n".join(table.splitlines()[1:]))
    with pytest.raises(AssertionError):
        check_refusal_table(table.replace("| 2 |", "| 1 |"))
    with pytest.raises(AssertionError, match="not in the code"):
        check_refusal_table(table + "\n| `a refusal nobody wrote` | 1 | |")
