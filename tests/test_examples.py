"""generated_examples/ snapshots: byte-identical renders, black- and ruff-clean, and they train."""

from __future__ import annotations

import ast
import difflib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TINY, run_jobs
from scaffold.examples import EXAMPLES, LAYERED_EXAMPLES, ROOT, render_example


def _on_disk(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_examples_folder_lists_exactly_the_named_examples():
    assert sorted(p.name for p in ROOT.iterdir() if p.is_dir()) == sorted([*EXAMPLES, *LAYERED_EXAMPLES])


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_snapshot_is_byte_identical(name):
    fresh = render_example(name)
    stored = _on_disk(ROOT / name)
    assert sorted(fresh) == sorted(stored), (
        f"file list differs for {name}; regenerate with: python -m scaffold.examples"
    )
    for path in fresh:
        if fresh[path] != stored[path]:
            diff = "".join(
                difflib.unified_diff(
                    stored[path].decode(errors="replace").splitlines(True),
                    fresh[path].decode(errors="replace").splitlines(True),
                    f"generated_examples/{name}/{path}", "fresh render",
                )
            )
            pytest.fail(f"{name}/{path} differs; regenerate with python -m scaffold.examples\n{diff[:6000]}")


# main() keeps the whole loop visible but no setup: at most this many lines, and no
# statement inside more than this many nested for/while/if/with/try blocks (issue 15);
# 226 since the loss's arguments (--label-smoothing, --class-weights) are built in main
MAIN_MAX_LINES = 226
MAIN_MAX_NESTING = 5
NESTING_BLOCKS = (ast.For, ast.AsyncFor, ast.While, ast.If, ast.With, ast.AsyncWith, ast.Try)


def nesting(statements: list, depth: int = 0) -> int:
    """The largest number of for/while/if/with/try blocks around any of `statements`."""
    deepest = depth
    for node in statements:
        inner = depth + isinstance(node, NESTING_BLOCKS)
        for field in ("body", "orelse", "finalbody"):
            deepest = max(deepest, nesting(getattr(node, field, []), inner))
        for handler in getattr(node, "handlers", []):
            deepest = max(deepest, nesting(handler.body, inner))
    return deepest


def test_nesting_counts_blocks():
    tree = ast.parse("def main():\n    x = 1\n    for a in b:\n        try:\n            pass\n"
                     "        except E:\n            if c:\n                y = 2\n")
    assert nesting(tree.body[0].body) == 3  # the `y = 2` is inside for, try, if
    assert nesting(ast.parse("x = 1").body) == 0


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_main_is_short_and_shallow(name):
    """Setup lives in named top-level functions; main() holds the loop (issue 15)."""
    tree = ast.parse((ROOT / name / "train.py").read_text())
    (main,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    lines = main.end_lineno - main.lineno + 1
    # pretrained adds its tokenizer, padding, frozen-backbone steps and export to setup
    limit = MAIN_MAX_LINES + (12 if "pretrained" in EXAMPLES[name][1] else 0)
    assert lines <= limit, f"{name}: main() has {lines} lines (at most {limit})"
    depth = nesting(main.body)
    assert depth <= MAIN_MAX_NESTING, f"{name}: main() nests {depth} blocks deep"
    closures = [n.name for n in ast.walk(main) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    assert closures == ["main"], f"{name}: functions defined inside main(): {closures[1:]}"


def test_docstrings_have_no_orphan_words():
    """No docstring line of train.py, callbacks.py or tests/ holds a lone word that the
    line above could have taken (a paragraph wrapped one word too late)."""
    orphans = []
    for name in EXAMPLES:
        paths = [ROOT / name / "train.py", *(ROOT / name).glob("callbacks.py"), *(ROOT / name).glob("tests/*.py")]
        for path in paths:
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)):
                    continue
                lines = (ast.get_docstring(node, clean=False) or "").splitlines()
                for above, line in zip(lines, lines[1:]):
                    words = line.split()
                    if len(words) == 1 and above.strip() and not line.startswith(" "):
                        orphans.append(f"{name}/{path.name}: {above.strip()[-30:]!r} / {line!r}")
    assert not orphans, "\n".join(sorted(set(orphans)))


def test_render_is_deterministic():
    assert render_example("all") == render_example("all")


def lint_in_own_folder(project: Path) -> list[str]:
    """What a user's `ruff check .`, `ruff check --select E,F,W,I,B .` and `black --check .`
    report inside the project's folder (its own pyproject.toml's settings, no other)."""
    ruff = [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise"]
    problems = []
    for command in ([*ruff, "."], [*ruff, "--select", "E,F,W,I,B", "."],
                    [sys.executable, "-m", "black", "--check", "-q", "."]):
        result = subprocess.run(command, cwd=project, capture_output=True, text=True)
        if result.returncode != 0:
            problems.append(f"{project.name}: {' '.join(command[2:])}:\n{result.stdout}{result.stderr}")
    return problems


def test_every_snapshot_is_lint_clean_in_its_own_folder(tmp_path):
    """Copied out of this checkout (whose settings must not apply), every snapshot passes ruff
    under its own pyproject.toml (E, F, W, I and B at black's 88 columns) and black; the same
    check fails on a zip() without strict= and on an unsorted import block."""
    import shutil

    problems = []
    for folder in sorted(p for p in ROOT.iterdir() if p.is_dir()):  # layer-acme's too
        shutil.copytree(folder, tmp_path / folder.name)
        problems += lint_in_own_folder(tmp_path / folder.name)
    assert not problems, "\n".join(problems)
    mine = tmp_path / "minimal" / "mine.py"
    mine.write_text("import torch\nimport os\n\nprint(list(zip(os.sep, torch.ones(1))))\n")
    found = "".join(lint_in_own_folder(tmp_path / "minimal"))
    assert "mine.py:1:1: I001" in found and "B905" in found, found


def test_unselected_features_leave_no_trace():
    from scaffold.catalogue import FEATURES

    for name, (task, features) in EXAMPLES.items():
        text = "\n".join(
            p.read_text() for p in (ROOT / name).rglob("*") if p.is_file() and p.suffix in (".py", ".sh", ".txt")
        )
        for feature in FEATURES:
            tagged = f"[{feature}]" in text
            assert tagged == (feature in features), f"{name}: [{feature}] tag present={tagged}"
        if "ddp" not in features and "fsdp" not in features:
            assert "dist." not in text and "is_main" not in text
        if "amp" not in features:
            assert "autocast" not in text and "GradScaler" not in text
        if "grad-accum" not in features:
            assert "grad_accum" not in text
        if "resume" not in features:
            assert "last.pt" not in text and "signal" not in text
            for trace in ("resum", "start_epoch", "batches_done"):
                assert trace not in text.lower(), f"{name}: {trace!r} without resume"


@pytest.mark.slow
def test_every_example_trains_a_few_steps(tmp_path, monkeypatch):
    import tiny_models

    # the trackers log offline and into this test's folder, never into the snapshots
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlruns.db'}")
    (tmp_path / "cwd").mkdir()
    # `pretrained` examples load tiny models built here instead of downloading one
    pretrained = {
        "image-classification": ["--model", "test_resnet", "--image-size", "32",
                                 "--weights", str(tiny_models.timm_weights(tmp_path / "timm.safetensors"))],
        "text-classification": ["--model", str(tiny_models.bert(tmp_path / "bert"))],
    }
    pretrained["token-classification"] = pretrained["text-classification"]
    jobs = [
        {"project": ROOT / name, "cwd": str(tmp_path / "cwd"),
         "args": [*TINY, "--epochs", "2", "--max-steps", "3", "--out-dir", str(tmp_path / name),
                  *(pretrained[task] if "pretrained" in features else [])]}
        for name, (task, features) in EXAMPLES.items()
    ]
    results = run_jobs(jobs, tmp_path)
    for name, result in zip(EXAMPLES, results):
        assert result["ok"], f"{name}: {result['error']}\n{result['stdout']}"
        assert (tmp_path / name / "final.pt").exists()
        assert (tmp_path / name / "metrics.csv").exists()


def config_comments(source: str) -> dict[str, str]:
    """Each Config field's comment, read with tokenize (not the generated field_help): the one
    on the field's line, else the comment lines right above it."""
    import io
    import tokenize

    tree = ast.parse(source)
    config = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Config")
    comments: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string[1:].strip()
    lines = source.splitlines()
    found = {}
    for node in config.body:
        if not isinstance(node, ast.AnnAssign):
            continue
        text = comments.get(node.end_lineno, "")
        row = node.lineno - 1  # the line above, numbered from 1
        while not text and lines[row - 1].strip().startswith("#"):
            row -= 1
        if not text:
            text = " ".join(comments[r] for r in range(row + 1, node.lineno))
        found[node.target.id] = text
    return found


@pytest.mark.parametrize("name", ["all", "token-classification-pretrained-all", "layer-acme"])
def test_help_explains_every_flag_with_its_comment_and_default(name, tmp_path):
    """`python train.py --help`: each Config field's flag with the field's comment (written once,
    in Config) and its default."""
    import shutil

    project = shutil.copytree(ROOT / name, tmp_path / name)
    source = (project / "train.py").read_text()
    comments = config_comments(source)
    assert len(comments) > 20 and all(comments.values()), [k for k, v in comments.items() if not v]
    # wide: argparse wraps the help at the terminal's width, breaking words at hyphens
    env = {**os.environ, "COLUMNS": "1000"}
    out = subprocess.run([sys.executable, "train.py", "--help"], cwd=project, capture_output=True,
                         text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    help_text = " ".join(out.stdout.split())  # argparse wraps the lines
    entries = help_text.split(" --")
    for field, comment in comments.items():
        flag = field.replace("_", "-")
        # a bool's entry is "--flag, --no-flag TEXT": its text follows --no-flag
        entry = next((e for e in entries if e.startswith((f"{flag} ", f"no-{flag} "))), None)
        assert entry is not None, flag
        assert " ".join(comment.split()) in entry, (flag, comment, entry)
        assert "(default: " in entry, (flag, entry)
