"""Your data on disk: the format README.md describes loads and trains, and a broken data
set stops the run before training, naming what is wrong. Each test writes its own tiny
data set."""

import pytest

from conftest import load, read_metrics, run_main

CONLL = """-DOCSTART- -X- O O

Alice NNP B-PER
visited VBD O
New NNP B-LOC
York NNP I-LOC
. . O

Acme NNP B-ORG
Corp NNP I-ORG
hired VBD O
Bob NNP B-PER

the DT O
weather NN O
"""


def test_conll_files_load_and_train(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.txt").write_text(CONLL * 2)
    (tmp_path / "data" / "val.txt").write_text(CONLL)
    args = ["--data-dir", tmp_path / "data", "--batch-size", 2, "--max-steps", 2]
    run_main(tmp_path / "out", *args)
    info = load(tmp_path / "out")["data"]
    assert info["tags"][0] == "O"
    assert set(info["tags"]) == {"O", "B-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"}
    train_rows, val_rows = read_metrics(tmp_path / "out")
    assert len(train_rows) == 2 and 0 <= val_rows[-1]["val_f1"] <= 1


def test_malformed_conll_is_reported_naming_file_and_line(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.txt").write_text("Alice B-PER\nvisited\nParis B-LOC\n")
    (tmp_path / "data" / "val.txt").write_text(CONLL)
    with pytest.raises(SystemExit) as stopped:
        run_main(tmp_path / "out", "--data-dir", tmp_path / "data")
    assert "train.txt:2" in str(stopped.value.code), stopped.value.code
    assert not (tmp_path / "out" / "metrics.csv").exists()
