"""After training, as a user runs it: train -> evaluate -> predict -> export, the four commands
of the README, in a generated project; refusals are one line; the token task's entity scores
agree with seqeval (the oracle).

Each generated project's own tests/test_after_training.py and tests/test_export.py hold the
detailed guarantees (evaluate == the logged validation numbers, predict == evaluate, the export
round trip per format); tests/test_generated_suite.py runs them for every task.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import TINY, render_project

pytestmark = pytest.mark.slow


def run_script(project: Path, *args: str, input: str | None = None):
    return subprocess.run(
        [sys.executable, *args], cwd=project, capture_output=True, text=True, input=input,
        timeout=600,
    )


def assert_one_line_refusal(proc, *needles: str) -> None:
    assert proc.returncode != 0, proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_train_evaluate_predict_export_as_the_readme_shows(tmp_path):
    project = render_project(tmp_path / "text", "text-classification", ["export"])
    other = render_project(tmp_path / "tokens", "token-classification")
    train = run_script(project, "train.py", *TINY, "--epochs", "1", "--out-dir", "runs/latest")
    assert train.returncode == 0, train.stderr[-2000:]
    assert (project / "runs/latest/curves.png").stat().st_size > 10_000

    evaluate = run_script(project, "evaluate.py", "runs/latest/best.pt")
    assert evaluate.returncode == 0, evaluate.stderr[-2000:]
    results = json.loads((project / "runs/latest/eval-val.json").read_text())
    assert results["samples"] == 40 and 0 <= results["accuracy"] <= 1

    predict = run_script(project, "predict.py", "runs/latest/best.pt", "-",
                         input="the team scored a goal\n\ngarlic soup for dinner\n")
    assert predict.returncode == 1  # the empty line 2
    rows = [json.loads(line) for line in predict.stdout.splitlines()]
    assert [row["input"] for row in rows] == ["<stdin>:1", "<stdin>:3"]
    assert "<stdin>:2: empty line" in predict.stderr

    export = run_script(project, "export.py", "runs/latest/best.pt", "--format", "onnx")
    assert export.returncode == 0, export.stderr[-2000:]
    assert "max abs diff" in export.stdout
    assert (project / "runs/latest/export/model.onnx").is_file()
    assert "vocab" in json.loads((project / "runs/latest/export/preprocessing.json").read_text())

    # data_info may carry keys of the user's own (issue 40): the checkpoint still loads
    checkpoint = project / "runs/latest/best.pt"
    own_keys = run_script(project, "-c", textwrap.dedent("""
        import torch
        state = torch.load("runs/latest/best.pt", weights_only=True)
        assert state["task"] == "text-classification"
        state["data"]["label_weights"] = [1.0, 2.0]
        torch.save(state, "runs/own-keys.pt")
    """))
    assert own_keys.returncode == 0, own_keys.stderr[-2000:]
    evaluate = run_script(project, "evaluate.py", "runs/own-keys.pt")
    assert evaluate.returncode == 0, evaluate.stderr[-2000:]
    again = json.loads((project / "runs/eval-val.json").read_text())
    assert (again["samples"], again["accuracy"]) == (results["samples"], results["accuracy"])

    # refusals: one line, no traceback, nothing written; another task's file names its task
    refused = run_script(other, "evaluate.py", str(checkpoint))
    assert_one_line_refusal(refused, "a text-classification checkpoint, not token-classification")
    damaged = tmp_path / "damaged.pt"
    damaged.write_bytes(checkpoint.read_bytes()[:500])
    refused = run_script(project, "export.py", str(damaged), "--format", "onnx")
    assert_one_line_refusal(refused, "not a readable checkpoint")
    assert not (tmp_path / "export").exists() and not list(other.glob("**/eval-*"))
    refused = run_script(project, "plot.py", str(tmp_path))
    assert_one_line_refusal(refused, "metrics.csv: missing")


ORACLE = textwrap.dedent("""
    import random, sys
    from seqeval.metrics import classification_report
    sys.path.insert(0, ".")
    import evaluate

    TAGS = ["O", "B-LOC", "B-ORG", "B-PER", "I-LOC", "I-ORG", "I-PER"]
    rng = random.Random(0)
    for trial in range(300):
        sentences, gold_tags, pred_tags = [], [], []
        for _ in range(rng.randint(1, 6)):
            n = rng.randint(1, 12)
            # gold tags and predictions both include ill-formed sequences (I-X after O or B-Y)
            gold = [rng.randrange(len(TAGS)) for _ in range(n)]
            pred = [t if rng.random() < 0.7 else rng.randrange(len(TAGS)) for t in gold]
            sentences.append((gold, pred, [1.0] * n))
            gold_tags.append([TAGS[t] for t in gold])
            pred_tags.append([TAGS[t] for t in pred])
        ours = evaluate.entity_scores(sentences, TAGS)
        oracle = classification_report(gold_tags, pred_tags, output_dict=True, zero_division=0)
        close = lambda a, b: abs(a - b) < 1e-9
        for kind, s in ours["per_type"].items():
            o = oracle[kind]
            assert close(s["precision"], o["precision"]), (trial, kind, s, o)
            assert close(s["recall"], o["recall"]), (trial, kind, s, o)
            assert close(s["f1"], o["f1-score"]), (trial, kind, s, o)
            assert s["support"] == o["support"], (trial, kind, s, o)
        kinds = [k for k in oracle if k not in ("micro avg", "macro avg", "weighted avg")]
        assert sorted(kinds) == sorted(ours["per_type"]), (trial, kinds, ours["per_type"])
        assert close(ours["entity_f1"], oracle["micro avg"]["f1-score"]), (trial, ours, oracle)
        assert close(ours["entity_precision"], oracle["micro avg"]["precision"]), trial
        assert close(ours["entity_recall"], oracle["micro avg"]["recall"]), trial
    print("ok", trial + 1)
""")


def test_token_entity_scores_agree_with_seqeval(tmp_path):
    pytest.importorskip("seqeval")
    project = render_project(tmp_path / "tokens", "token-classification")
    proc = run_script(project, "-c", ORACLE)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok 300", proc.stderr[-3000:]
