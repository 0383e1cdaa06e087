"""Team layers (issue 23): a layer's features, defaults, files and blocks at the extension points.

The sample layer is examples/layers/acme (a JSON-lines experiment log feature, two changed Config
defaults, a CODEOWNERS and a CI file). Renders run in this process; the generated code runs through
tests/runner.py, in one process for all tasks.
"""

from __future__ import annotations

import ast
import contextlib
import csv
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import REPO, TINY, run_jobs
from scaffold import layers
from scaffold.answers import Answers
from scaffold.catalogue import TASKS
from scaffold.cli import app
from scaffold.errors import ScaffoldError
from scaffold.examples import LAYERED_EXAMPLES, ROOT, render_example
from scaffold.merge import change_feature
from scaffold.render import project_files, render
from scaffold.tags import feature_lines
from scaffold.write import write_new_project
from test_tags import untagged_lines

ACME = REPO / "examples" / "layers" / "acme"
BLOCK = "features/jsonl-log/blocks/train.py"


def _code(files: dict[str, bytes]) -> dict[str, str]:
    return {p: d.decode() for p, d in files.items() if not p.startswith(".scaffold/")}


def _render(task: str, features=(), layer: Path | None = ACME) -> dict[str, str]:
    pins = (str(layer),) if layer else ()
    return _code(render(Answers("proj", task, tuple(features), layers=pins)))


@pytest.fixture
def acme(tmp_path) -> Path:
    """A copy of the sample layer that a test may change."""
    return Path(shutil.copytree(ACME, tmp_path / "acme-layer"))


def test_every_task_with_and_without_the_layer():
    for task in TASKS:
        plain = _render(task, layer=None)
        layered = _render(task)  # the layer, its feature not chosen: defaults and files only
        logged = _render(task, ["jsonl-log"])
        # without a layer, not a trace of the extension points
        assert "#@point" not in "".join(plain.values())
        assert not any("[acme" in text or "experiment_log" in text for text in plain.values())
        # the layer alone: its files and defaults, no block of an unchosen feature
        assert set(layered) - set(plain) == {"CODEOWNERS", ".gitlab-ci.yml"}
        assert "lr: float = 0.001  #" in layered["train.py"]
        assert "log_every: int = 5  #" in layered["train.py"]
        assert "acme:jsonl-log" not in "".join(layered.values())
        # the feature: its module, its test, and blocks at five points, every line tagged
        assert set(logged) - set(layered) == {"experiment_log.py", "tests/test_experiment_log.py"}
        assert untagged_lines("acme:jsonl-log", layered, logged) == []
        covered = feature_lines("train.py", logged["train.py"])["acme:jsonl-log"]
        assert len(covered) >= 12, covered
        for text in logged.values():
            assert "#@point" not in text


def test_the_layered_snapshot_is_byte_identical():
    for name in LAYERED_EXAMPLES:
        on_disk = {
            p.relative_to(ROOT / name).as_posix(): p.read_bytes()
            for p in (ROOT / name).rglob("*")
            if p.is_file()
        }
        assert render_example(name) == on_disk, name


def test_a_block_goes_where_its_point_is(acme):
    (acme / BLOCK / "after_update.jinja").write_text("# [acme:jsonl-log]\nmarker_line = step\n")
    train = _render("image-classification", ["jsonl-log"], acme)["train.py"]
    lines = train.splitlines()
    at = lines.index("                marker_line = step")
    before = "\n".join(lines[at - 12 : at])
    assert "samples, log_time = 0, time.perf_counter()" in before  # after the update is logged
    assert "# --- validation" in "\n".join(lines[at : at + 30])


@pytest.mark.slow
def test_layered_projects_run_without_scaffold_or_the_layer(tmp_path, acme):
    """Every task with the layer's feature (and with ddp, whose rank-0 branch the block has),
    rendered from a copy of the layer that is then deleted; train.py imports neither."""
    projects = {}
    for task, extra in [(t, []) for t in TASKS] + [("text-classification", ["ddp"])]:
        name = f"{task}-{'-'.join(extra) or 'plain'}"
        files = project_files(Answers(f"p{len(projects)}", task, ("jsonl-log", *extra), layers=(str(acme),)))
        write_new_project(tmp_path / name, files)
        projects[name] = tmp_path / name
    shutil.rmtree(acme)
    for project in projects.values():
        for path in project.glob("*.py"):
            imported = {
                (n.module if isinstance(n, ast.ImportFrom) else a.name).split(".")[0]
                for n in ast.walk(ast.parse(path.read_text()))
                if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in n.names
            }
            assert not imported & {"scaffold", "jinja2", "copier"}, (path, imported)
    jobs = [
        {"project": p, "args": [*TINY, "--epochs", "2", "--max-steps", "4", "--out-dir", str(tmp_path / f"out-{n}")]}
        for n, p in projects.items()
    ]
    for (name, project), result in zip(projects.items(), run_jobs(jobs, tmp_path)):
        assert result["ok"], f"{name}: {result['error']}\n{result['stdout']}"
        events = [
            __import__("json").loads(line)
            for line in (tmp_path / f"out-{name}" / "experiment.jsonl").read_text().splitlines()
        ]
        kinds = [e["event"] for e in events]
        assert kinds[0] == "start" and kinds[-1] == "end", kinds
        assert [e["step"] for e in events if e["event"] == "update"] == [1, 2, 3, 4]
        with open(tmp_path / f"out-{name}" / "metrics.csv") as f:
            validated = [float(row["val_loss"]) for row in csv.DictReader(f) if row["val_loss"]]
        assert [e["val_loss"] for e in events if e["event"] == "validation"] == validated != []
    # the layer's own generated test passes in its project, run as the user runs it
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_experiment_log.py"],
        cwd=projects["image-classification-plain"], capture_output=True, text=True, timeout=300,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_add_and_remove_the_layer_feature_in_an_edited_project(tmp_path, acme):
    project = tmp_path / "proj"
    write_new_project(
        project, project_files(Answers("proj", "image-classification", layers=(str(acme),)))
    )
    train = project / "train.py"
    edited = train.read_text().replace(
        "    print(f\"done: {step} updates",
        "    print(\"my own line, kept\")\n    print(f\"done: {step} updates",
    )
    assert edited != train.read_text()
    train.write_text(edited)
    result = change_feature(project, "jsonl-log", add=True, echo=lambda *_: None)
    assert result.exit_code == 0
    text = train.read_text()
    assert "my own line, kept" in text and "import experiment_log  # [acme:jsonl-log]" in text
    assert text.count("experiment_log.append(") == 4
    assert (project / "experiment_log.py").is_file()
    assert (project / "tests" / "test_experiment_log.py").is_file()
    result = change_feature(project, "jsonl-log", add=False, echo=lambda *_: None)
    assert result.exit_code == 0
    assert train.read_text() == edited
    assert not (project / "experiment_log.py").exists()


def test_two_layers_cannot_define_the_same_feature(tmp_path, acme):
    other = Path(shutil.copytree(ACME, tmp_path / "beta"))
    manifest = other / "layer.toml"
    manifest.write_text(manifest.read_text().replace('name = "acme"', 'name = "beta"'))
    with pytest.raises(ScaffoldError, match="layers 'acme' and 'beta' both define feature 'jsonl-log'"):
        Answers("proj", layers=(str(acme), str(other))).validated()


def _refused(tmp_path, *args) -> str:
    dest = tmp_path / "new-project"
    result = CliRunner().invoke(app, ["new", str(dest), "--defaults", *args])
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert not dest.exists(), "a refusal wrote something"
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: layer "), result.output
    return lines[0]


def test_bad_layers_are_refused_in_one_line(tmp_path, acme):
    manifest = acme / "layer.toml"
    good = manifest.read_text()
    cases = [
        (manifest, good.replace('version = "1.0.0"', 'version = "1.0.0'), "layer.toml does not parse"),
        (manifest, good.replace("[features.jsonl-log]", "[features.amp]"), "collides with scaffold's own 'amp'"),
        (manifest, good.replace('">=0.1,<0.2"', '">=2"'), "supports scaffold >=2, not 0.1.0"),
        (acme / BLOCK / "after_lunch.jinja", "x = 1\n", "names no extension point (train.py after_lunch)"),
        (acme / BLOCK / "after_update.jinja", "{{ no_such_name }}\n", "fails to render"),
        (acme / BLOCK / "after_update.jinja", "{{ ''.__class__.__mro__ }}\n", "could run code"),
        (acme / BLOCK / "after_update.jinja", "{% include 'x' %}\n", "could run code"),
        (acme / BLOCK / "after_update.jinja", "{{ features.append('amp') }}\n", "could run code"),
    ]
    for path, text, expected in cases:
        before = path.read_text() if path.exists() else None
        path.write_text(text)
        line = _refused(tmp_path, "--layer", str(acme), "-f", "jsonl-log")
        assert expected in line, (expected, line)
        path.write_text(before) if before is not None else path.unlink()
    assert "No such file" not in _refused(tmp_path, "--layer", str(tmp_path / "nowhere"))


def test_the_team_default_layer(tmp_path, monkeypatch, acme):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv(layers.ENV_VAR, raising=False)
    assert layers.default_sources() == []
    config = tmp_path / "config" / "scaffold" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(f"layers = [{str(acme)!r}]\n")
    result = CliRunner().invoke(app, ["new", str(tmp_path / "a"), "--defaults"])
    assert result.exit_code == 0, result.output
    assert "layer: acme 1.0.0" in result.output
    assert "ACME training project" in (tmp_path / "a" / "README.md").read_text()
    monkeypatch.setenv(layers.ENV_VAR, "")  # the variable, even empty, wins over the file
    result = CliRunner().invoke(app, ["new", str(tmp_path / "b"), "--defaults"])
    assert result.exit_code == 0 and not (tmp_path / "b" / "CODEOWNERS").exists()
    result = CliRunner().invoke(app, ["features"])
    assert "jsonl-log" not in result.output
    monkeypatch.setenv(layers.ENV_VAR, str(acme))
    assert "jsonl-log (acme)" in CliRunner().invoke(app, ["features"]).output
    result = CliRunner().invoke(app, ["new", str(tmp_path / "c"), "--defaults", "--no-layer"])
    assert result.exit_code == 0 and not (tmp_path / "c" / "CODEOWNERS").exists()


def _git(*args, cwd):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin", "HOME": str(cwd)})


@pytest.fixture
def git_layer(tmp_path, monkeypatch, acme):
    """The sample layer published as a bare git repository; scaffold's cache in tmp_path."""
    monkeypatch.setenv("SCAFFOLD_CACHE_DIR", str(tmp_path / "cache"))
    layers.cache.cache_dir.cache_clear()
    _git("init", "-q", "-b", "main", cwd=acme)
    _git("add", "-A", cwd=acme)
    _git("commit", "-q", "-m", "acme 1.0.0", cwd=acme)
    bare = tmp_path / "acme.git"
    _git("clone", "-q", "--bare", str(acme), str(bare), cwd=tmp_path)
    yield acme, bare
    layers.cache.cache_dir.cache_clear()


def test_a_git_layer_is_cached_and_pinned_by_commit(tmp_path, git_layer):
    work, bare = git_layer
    source = f"file://{bare}#main"
    result = CliRunner().invoke(app, ["new", str(tmp_path / "p"), "--defaults", "-l", source, "-f", "jsonl-log"])
    assert result.exit_code == 0, result.output
    record = (tmp_path / "p" / ".scaffold" / "record.json").read_text()
    commit = subprocess.run(["git", "rev-parse", "main"], cwd=bare, capture_output=True, text=True).stdout.strip()
    assert commit in record and source in record
    listed = CliRunner().invoke(app, ["layers"]).output
    assert f"acme 1.0.0  file://{bare} @ {commit[:12]}" in listed
    status = CliRunner().invoke(app, ["status", "--project", str(tmp_path / "p")]).output
    assert f"layer: acme 1.0.0 ({source} @ {commit[:19]})" in status
    # a new layer commit does not move the project: add/remove re-render at the recorded commit
    (work / BLOCK / "after_update.jinja").write_text("# [acme:jsonl-log] changed\npass\n")
    _git("commit", "-q", "-am", "acme 1.1.0", cwd=work)
    _git("push", "-q", str(bare), "main", cwd=work)
    result = change_feature(tmp_path / "p", "amp", add=True, echo=lambda *_: None)
    assert result.exit_code == 0
    train = (tmp_path / "p" / "train.py").read_text()
    assert "# [acme:jsonl-log] changed" not in train and "[amp]" in train


def test_a_url_in_the_team_default_variable(tmp_path, monkeypatch, git_layer, acme):
    """$SCAFFOLD_LAYER is split on ':' as PATH is, but never inside a URL (issue 33)."""
    _, bare = git_layer
    url = f"file://{bare}#main"
    monkeypatch.setenv(layers.ENV_VAR, url)
    listed = CliRunner().invoke(app, ["layers"])
    assert listed.exit_code == 0, listed.output
    assert f"default: {url} (from ${layers.ENV_VAR})" in listed.output
    result = CliRunner().invoke(app, ["new", str(tmp_path / "p"), "--defaults"])
    assert result.exit_code == 0, result.output
    assert url in (tmp_path / "p" / ".scaffold" / "record.json").read_text()
    assert layers.split_sources(f"{acme}:https://git.acme.com/ml/acme-layer.git#v1:./x") == [
        str(acme),
        "https://git.acme.com/ml/acme-layer.git#v1",
        "./x",
    ]
    assert layers.split_sources("git@github.com:acme/layer.git#v1::ssh://git@h:22/l.git#v2") == [
        "git@github.com:acme/layer.git#v1",
        "ssh://git@h:22/l.git#v2",
    ]


def test_upgrade_pulls_a_new_layer_version_into_an_edited_project(tmp_path, git_layer):
    """A new layer commit (a changed line in its block, a new file, a new version) reaches an
    edited project through `scaffold upgrade`'s three-way merge: edits kept, change applied."""
    from scaffold.upgrade import check_project, upgrade_project

    work, bare = git_layer
    project = tmp_path / "p"
    result = CliRunner().invoke(
        app, ["new", str(project), "--defaults", "-l", f"file://{bare}#main", "-f", "jsonl-log"]
    )
    assert result.exit_code == 0, result.output
    train = project / "train.py"
    mine = "    print(\"my own line, kept\")\n"
    edited = train.read_text().replace("    print(f\"done: {step} updates", mine + "    print(f\"done: {step} updates")
    train.write_text(edited)
    (project / "experiment_log.py").write_text(
        (project / "experiment_log.py").read_text() + "\n\n# my note at the end\n"
    )
    assert check_project(project)[0] == 0
    block = work / BLOCK / "after_update.jinja"
    block.write_text(block.read_text().replace("every update, not only", "each update, not only"))
    (work / "files" / "CONTRIBUTING.md").write_text("# Contributing to an ACME project\n")
    manifest = work / "layer.toml"
    manifest.write_text(manifest.read_text().replace('version = "1.0.0"', 'version = "1.1.0"'))
    _git("add", "-A", cwd=work)
    _git("commit", "-q", "-m", "acme 1.1.0", cwd=work)
    _git("push", "-q", str(bare), "main", cwd=work)
    code, lines = check_project(project)
    assert code == 1 and "layer update available: layer acme 1.0.0" in lines[0], lines
    out = []
    upgraded = upgrade_project(project, echo=out.append)
    assert upgraded.change.exit_code == 0, out
    text = train.read_text()
    assert mine in text, "the user's edit was lost"
    assert "# [acme:jsonl-log] each update, not only every --log-every" in text
    assert "every update, not only" not in text
    assert (project / "CONTRIBUTING.md").read_text() == "# Contributing to an ACME project\n"
    assert "# my note at the end" in (project / "experiment_log.py").read_text()
    assert check_project(project)[0] == 0
    status = CliRunner().invoke(app, ["status", "--project", str(project)]).output
    assert "layer: acme 1.1.0" in status
    assert any("acme 1.0.0" in line and "-> 1.1.0" in line for line in out), out


def test_an_always_on_feature_is_in_every_project_and_cannot_be_removed(tmp_path, acme):
    manifest = acme / "layer.toml"
    manifest.write_text(manifest.read_text().replace("features = []", 'features = ["jsonl-log"]'))
    project = tmp_path / "proj"
    answers = Answers("proj", "text-classification", layers=(str(acme),))
    write_new_project(project, project_files(answers))
    assert (project / "experiment_log.py").is_file()
    with pytest.raises(ScaffoldError, match="'jsonl-log' is always on in layer 'acme'"):
        change_feature(project, "jsonl-log", add=False, echo=lambda *_: None)


# --- hostile layers (issue 32): a layer is code from somewhere else ------------------------------
#
# Each case is what a hostile layer author would try; each must be one `error: layer ...` line,
# exit 2, nothing written, and no secret's text anywhere in the output.

SECRET = "aws_secret_access_key = TOPSECRET-do-not-copy"


@pytest.fixture
def secret(tmp_path) -> Path:
    path = tmp_path / "home" / ".aws" / "credentials"
    path.parent.mkdir(parents=True)
    path.write_text(SECRET + "\n")
    return path


def test_a_link_out_of_a_directory_layer_is_refused_before_anything_is_read(tmp_path, acme, secret):
    feature = acme / "features" / "jsonl-log"
    block = feature / "blocks" / "train.py" / "after_update.jinja"
    cases = [  # (the link, its target as written)
        (acme / "files" / "notes.txt", str(secret)),
        (feature / "files" / "notes.txt", os.path.relpath(secret, feature / "files")),
        (block, str(secret)),  # a block template that is a link: its target would be rendered
        (acme / "files" / "gone.txt", str(tmp_path / "nothing-here")),
        (acme / "files" / "ci", str(acme / "features")),  # a folder, even inside the layer
    ]
    original = block.read_text()
    for link, target in cases:
        if link.exists():
            link.unlink()
        link.symlink_to(target)
        line = _refused(tmp_path, "--layer", str(acme), "-f", "jsonl-log")
        rel = link.relative_to(acme).as_posix()
        assert f"{rel} is a link to {target}, which is not a file inside the layer" in line, line
        assert "TOPSECRET" not in line
        link.unlink()
    block.write_text(original)
    os.mkfifo(acme / "files" / "pipe")  # reading it would block scaffold forever
    assert "files/pipe is not a regular file" in _refused(tmp_path, "--layer", str(acme))
    (acme / "files" / "pipe").unlink()
    # a link to one of the layer's own files is followed
    (acme / "files" / "NOTICE").symlink_to("../layer.toml")
    result = CliRunner().invoke(app, ["new", str(tmp_path / "ok"), "--defaults", "-l", str(acme)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "ok" / "NOTICE").read_text() == (acme / "layer.toml").read_text()


def test_a_link_out_of_a_git_layer_is_refused_in_one_line(tmp_path, git_layer, secret):
    work, bare = git_layer
    source = f"file://{bare}#main"
    (work / "files" / "NOTICE").symlink_to("../layer.toml")  # inside: allowed
    _git("add", "-A", cwd=work)
    _git("commit", "-q", "-m", "a link inside", cwd=work)
    _git("push", "-q", str(bare), "main", cwd=work)
    result = CliRunner().invoke(app, ["new", str(tmp_path / "ok"), "--defaults", "-l", source])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "ok" / "NOTICE").read_text() == (work / "layer.toml").read_text()
    for name, target in [("abs.txt", str(secret)), ("rel.txt", "../../../home/.aws/credentials")]:
        link = work / "features" / "jsonl-log" / "files" / name
        link.symlink_to(target)
        _git("add", "-A", cwd=work)
        _git("commit", "-q", "-m", f"a link out: {name}", cwd=work)
        _git("push", "-q", str(bare), "main", cwd=work)
        line = _refused(tmp_path, "--layer", source, "-f", "jsonl-log")
        assert "internal error" not in line
        rel = f"features/jsonl-log/files/{name}"
        assert f"{rel} is a link to {target}, which is not a file inside the layer" in line, line
        link.unlink()
    # nothing of the refused commits was extracted into the cache
    extracted = [p for p in (tmp_path / "cache").rglob("*") if p.name in ("abs.txt", "rel.txt")]
    assert extracted == []


@contextlib.contextmanager
def _memory_cap(extra: int = 1 << 30):
    """This process may allocate `extra` more bytes of address space (a template that builds
    gigabytes fails with MemoryError instead of swapping the machine)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/status") as status:
        vm = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + extra, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def test_what_a_layer_template_builds_is_bounded(tmp_path, acme):
    block = acme / BLOCK / "after_update.jinja"
    good = block.read_text()
    a_big = '{% set big = "x" * 900000 %}'
    cases = [
        '{{ "x" * 3000000000 }}',
        "{{ [0] * 3000000000 }}",
        "{{ 3000000000 * [0] }}",
        "{% for i in range(100000) %}{% for j in range(100000) %}xxxxxxxxxx{% endfor %}{% endfor %}",
        a_big + "{{ big ~ big }}",
        a_big + "{{ big + big }}",
        '{{ "x" | center(3000000000) }}',
        '{{ "x" | indent(3000000000, true) }}',
        '{{ "x".ljust(3000000000) }}',
        '{{ "%3000000000s" | format(1) }}',
        '{{ "%3000000000s" % 1 }}',
        '{{ "{:>3000000000}".format(1) }}',
        "{{ 10 ** 3000000000 }}",
        '{% set k = "x" * 2000 %}{{ k | replace("x", k) }}',
        '{% set k = "x" * 2000 %}{{ k.replace("x", k) }}',
    ]
    with _memory_cap():
        for text in cases:
            block.write_text(text + "\n")
            line = _refused(tmp_path, "--layer", str(acme), "-f", "jsonl-log")
            expected = "features/jsonl-log/blocks/train.py/after_update.jinja builds more than"
            assert expected in line, (text, line)
            assert "MemoryError" not in line
    # what stays under the bound renders as before, `~` included
    block.write_text(good + '{{ "# " ~ task ~ " " ~ ("=" * 3) }}\n')
    result = CliRunner().invoke(
        app, ["new", str(tmp_path / "ok"), "--defaults", "-l", str(acme), "-f", "jsonl-log"]
    )
    assert result.exit_code == 0, result.output
    assert "# image-classification ===" in (tmp_path / "ok" / "train.py").read_text()
