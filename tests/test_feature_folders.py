"""Features as folders (issue 39): the catalogue is read from templates/features/NAME/feature.toml,
and scaffold's features and a layer's are placed by one mechanism (scaffold/blocks.py)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib

import pytest

from conftest import REPO, TINY, run_train
from scaffold.blocks import POINTS, Block, place
from scaffold.catalogue import FEATURES, TASKS, load_features, load_tasks
from scaffold.errors import ScaffoldError

FEATURE_DIR = REPO / "templates" / "features"


def test_every_feature_is_a_folder_with_its_feature_toml():
    folders = sorted(p.name for p in FEATURE_DIR.iterdir() if p.is_dir())
    assert folders == sorted(FEATURES)
    for name, feature in FEATURES.items():
        data = tomllib.loads((FEATURE_DIR / name / "feature.toml").read_text())
        assert feature.help == data["help"] and feature.packages == tuple(data.get("packages", ()))
    orders = [tomllib.loads((FEATURE_DIR / n / "feature.toml").read_text())["order"] for n in FEATURES]
    assert orders == sorted(orders)  # the catalogue's order is the folders' `order`


def _config_fields(train_py) -> set[str]:
    tree = ast.parse(train_py.read_text())
    config = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Config")
    return {s.target.id for s in config.body if isinstance(s, ast.AnnAssign)}


def test_feature_toml_names_the_config_fields_the_feature_adds():
    examples = REPO / "generated_examples"
    plain = _config_fields(examples / "minimal" / "train.py")
    for name, feature in FEATURES.items():
        example = examples / (name if name != "pretrained" else "image-classification-pretrained")
        added = _config_fields(example / "train.py") - plain
        assert added == set(feature.config), name


def test_a_damaged_feature_toml_is_refused(tmp_path):
    for text, why in (("order = 1\n", "'help'"), ("order = 1\nhelp = 'x'\nrequire = []\n", "unknown key"),
                      ("order = [", "is damaged"), ("order = 1\nhelp = 'x'\npackages = 'a'\n", "list")):
        folder = tmp_path / "features" / "x"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "feature.toml").write_text(text)
        with pytest.raises(ScaffoldError, match=why):
            load_features(tmp_path)


def test_every_task_is_a_folder_with_its_task_toml_data_and_model():
    """Issue 40: a task is templates/tasks/NAME/ (task.toml, data.py.jinja, model.py.jinja), and
    the core data.py and model.py include the chosen task's: no task is named in them."""
    task_dir = REPO / "templates" / "tasks"
    assert sorted(p.name for p in task_dir.iterdir() if p.is_dir()) == sorted(TASKS)
    for name, task in TASKS.items():
        data = tomllib.loads((task_dir / name / "task.toml").read_text())
        assert task.help == data["help"] and task.packages == tuple(data.get("packages", ()))
        assert {"data.py.jinja", "model.py.jinja"} <= {p.name for p in (task_dir / name).iterdir()}
    for core in ("data.py.jinja", "model.py.jinja"):
        text = (REPO / "templates" / "project" / core).read_text()
        assert f'{{% include "tasks/" ~ task ~ "/{core}" %}}' in text
        assert not any(name in text for name in TASKS), core
    # data.py is the task's alone; model.py keeps the loading functions every task shares
    assert "{% if image" not in (REPO / "templates" / "project" / "data.py.jinja").read_text()
    orders = [tomllib.loads((task_dir / n / "task.toml").read_text())["order"] for n in TASKS]
    assert orders == sorted(orders)


def test_a_damaged_task_toml_is_refused(tmp_path):
    for text, why in (("order = 1\n", "'help'"), ("order = 1\nhelp = 'x'\nrequires = []\n", "unknown key"),
                      ("help = [", "is damaged"), ("order = 1\nhelp = 'x'\npackages = 'a'\n", "list")):
        folder = tmp_path / "tasks" / "x"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "task.toml").write_text(text)
        with pytest.raises(ScaffoldError, match=why):
            load_tasks(tmp_path)


def test_a_block_must_find_its_point():
    block = Block("train.py", "config", "a: int = 1\n", "features/x/blocks/train.py/config.jinja")
    placed = place({"train.py": b"class Config:\n    #@point config\n    b: int = 2\n"}, [block])
    assert placed["train.py"] == b"class Config:\n    a: int = 1\n    b: int = 2\n"
    with pytest.raises(ScaffoldError, match="has no point 'config'"):
        place({"train.py": b"class Config:\n    b: int = 2\n"}, [block])
    assert "config" in POINTS["train.py"]


HELLO = {
    "feature.toml": 'order = 1000\nhelp = "Say hello after the first update."\n'
                    'config = ["hello_name"]\n',
    "blocks/train.py/config.jinja": 'hello_name: str = "world"  # [hello] who is greeted\n',
    "blocks/train.py/imports.jinja": "from hello import greeting  # [hello]\n",
    "blocks/train.py/after_update.jinja": "if step == 1:  # [hello]\n"
                                          "    print(greeting(cfg.hello_name), flush=True)\n",
    "files/hello.py.jinja": '"""Greetings for {{ project_name }}."""\n\n\n'
                            'def greeting(name: str) -> str:\n    return f"hello, {name}"\n',
    "files/tests/test_hello.py": "from hello import greeting\n\n\n"
                                 "def test_greeting():\n"
                                 '    assert greeting("you") == "hello, you"\n',
}


def test_a_new_feature_is_one_folder(tmp_path):
    """A contributor adds templates/features/hello/ to a copy of scaffold and nothing else: the
    feature is listed, renders at its points, and the project trains and passes its tests."""
    source = tmp_path / "source"
    shutil.copytree(REPO / "scaffold", source / "scaffold",
                    ignore=shutil.ignore_patterns("__pycache__", "templates"))
    shutil.copytree(REPO / "templates", source / "templates")
    for rel, text in HELLO.items():
        path = source / "templates" / "features" / "hello" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    env = {**os.environ, "PYTHONPATH": str(source)}

    def scaffold(*args):
        return subprocess.run([sys.executable, "-m", "scaffold", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)

    listed = scaffold("features")
    assert listed.returncode == 0 and "Say hello after the first update." in listed.stdout
    made = scaffold("new", "p", "-f", "hello", "-f", "amp")
    assert made.returncode == 0, made.stdout + made.stderr
    project = tmp_path / "p"
    train = (project / "train.py").read_text()
    assert "from hello import greeting  # [hello]\n" in train
    assert '    hello_name: str = "world"  # [hello] who is greeted\n' in train
    assert (project / "hello.py").read_text().startswith('"""Greetings for p."""')
    assert _config_fields(project / "train.py") - _config_fields(
        REPO / "generated_examples" / "amp" / "train.py") == {"hello_name"}
    ran = run_train(project, [*TINY, "--epochs", "1", "--max-steps", "2", "--hello-name", "you"])
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.count("hello, you") == 1
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            "tests/test_hello.py"], cwd=project, capture_output=True, text=True)
    assert tests.returncode == 0, tests.stdout[-2000:]
    plain = scaffold("new", "q", "-f", "amp")  # not chosen: no trace of it
    assert plain.returncode == 0 and "hello" not in (tmp_path / "q" / "train.py").read_text()
    assert not (tmp_path / "q" / "hello.py").exists()


def test_a_point_line_that_survives_is_refused():
    """A point glued to the line before it (a block ending in `{% endif %}`) would reach the
    project: render refuses it (sweep's README had one before template version 25)."""
    from scaffold.render import _check_no_template_syntax

    with pytest.raises(ScaffoldError, match="survived into README.md"):
        _check_no_template_syntax({"README.md": b"it again.#@point features\n"})
    blocks = [Block("README.md", "features", "- [x] a line{% endif %}", "features/x")]
    assert place({"README.md": b"#@point features\n\nFeature tags\n"}, blocks)["README.md"] == (
        b"- [x] a line{% endif %}\n\nFeature tags\n")


def test_the_points_a_layer_may_use_are_the_core_templates_points():
    from scaffold.blocks import core_points
    from scaffold.paths import template_dir

    assert core_points(template_dir()) == POINTS


def test_the_regions_are_the_core_templates_regions():
    from scaffold.blocks import REGION, REGIONS, core_points
    from scaffold.paths import template_dir

    assert core_points(template_dir(), REGION) == REGIONS


CORE_WITH_REGION = b"""def main():
    #@region epoch_range
    for epoch in range(cfg.epochs):
    #@end epoch_range
        pass
"""


def test_a_feature_replaces_a_region_and_without_one_the_core_lines_stay():
    """A region is the core's lines unless one of scaffold's features has a block of that name
    (resume's `for epoch in range(start_epoch, ...)`); a block that renders nothing (its feature's
    condition false) leaves the core's lines."""
    files = {"train.py": CORE_WITH_REGION}
    resume = Block("train.py", "epoch_range", "for epoch in range(start_epoch, cfg.epochs):  # [resume]\n",
                   "features/resume")
    assert place(files, [resume])["train.py"] == (
        b"def main():\n    for epoch in range(start_epoch, cfg.epochs):  # [resume]\n        pass\n")
    plain = b"def main():\n    for epoch in range(cfg.epochs):\n        pass\n"
    assert place(files, [])["train.py"] == plain
    assert place(files, [Block("train.py", "epoch_range", "\n", "features/x")])["train.py"] == plain


def test_two_blocks_for_one_region_or_a_layers_are_refused():
    files = {"train.py": CORE_WITH_REGION}
    a = Block("train.py", "epoch_range", "for a in b:\n", "features/a")
    b = Block("train.py", "epoch_range", "for c in d:\n", "features/b")
    with pytest.raises(ScaffoldError, match="only one of scaffold's own features may replace"):
        place(files, [a, b])
    layer = Block("train.py", "epoch_range", "for c in d:\n", "acme: features/x", padded=True)
    with pytest.raises(ScaffoldError, match="only one of scaffold's own features may replace"):
        place(files, [layer])
