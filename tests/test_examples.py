"""generated_examples/ snapshots: byte-identical renders, black- and ruff-clean, and they train."""

from __future__ import annotations

import difflib
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, TINY, run_jobs
from scaffold.examples import EXAMPLES, ROOT, render_example


def _on_disk(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_examples_folder_lists_exactly_the_named_examples():
    assert sorted(p.name for p in ROOT.iterdir() if p.is_dir()) == sorted(EXAMPLES)


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


def test_render_is_deterministic():
    assert render_example("all") == render_example("all")


def test_examples_are_black_and_ruff_clean():
    black = subprocess.run([sys.executable, "-m", "black", "--check", "-q", str(ROOT)], capture_output=True, text=True)
    assert black.returncode == 0, black.stderr
    ruff = subprocess.run(
        # F: pyflakes; E9: syntax; E501: no line over black's 88 columns (black cannot split
        # long strings and comments; the templates must)
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--isolated", "--select", "F,E9,E501",
         "--line-length", "88", str(ROOT)],
        capture_output=True, text=True,
    )
    assert ruff.returncode == 0, ruff.stdout


def test_unselected_features_leave_no_trace():
    from scaffold.catalogue import FEATURES

    for name, (task, features) in EXAMPLES.items():
        text = "\n".join(
            p.read_text() for p in (ROOT / name).rglob("*") if p.is_file() and p.suffix in (".py", ".sh", ".txt")
        )
        for feature in FEATURES:
            tagged = f"[{feature}]" in text
            assert tagged == (feature in features), f"{name}: [{feature}] tag present={tagged}"
        if "ddp" not in features:
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
def test_every_example_trains_a_few_steps(tmp_path):
    import tiny_models

    # `pretrained` examples load tiny models built here instead of downloading one
    pretrained = {
        "image-classification": ["--model", "test_resnet", "--image-size", "32",
                                 "--weights", str(tiny_models.timm_weights(tmp_path / "timm.safetensors"))],
        "text-classification": ["--model", str(tiny_models.bert(tmp_path / "bert"))],
    }
    pretrained["token-classification"] = pretrained["text-classification"]
    jobs = [
        {"project": ROOT / name, "args": [*TINY, "--epochs", "2", "--max-steps", "3", "--out-dir", str(tmp_path / name),
                                          *(pretrained[task] if "pretrained" in features else [])]}
        for name, (task, features) in EXAMPLES.items()
    ]
    results = run_jobs(jobs, tmp_path)
    for name, result in zip(EXAMPLES, results):
        assert result["ok"], f"{name}: {result['error']}\n{result['stdout']}"
        assert (tmp_path / name / "final.pt").exists()
        assert (tmp_path / name / "metrics.csv").exists()
