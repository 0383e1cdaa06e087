"""Your data on disk: the format README.md describes loads and trains, and a broken data
set stops the run before training, naming what is wrong. Each test writes its own tiny
data set."""

import pytest

from conftest import load, read_metrics, run_main

ROWS = [
    ("A great match, the team scored twice!", "sports"),
    ('The "coach" praised the league', "sports"),
    ("Bake the bread, then the sauce", "food"),
    ("Garlic soup for dinner", "food"),
]


def write_csv(path, rows, header=("text", "label")):
    import csv

    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def test_csv_files_load_and_train(tmp_path):
    (tmp_path / "data").mkdir()
    write_csv(tmp_path / "data" / "train.csv", ROWS * 2)
    write_csv(tmp_path / "data" / "val.csv", ROWS[::-1])
    args = ["--data-dir", tmp_path / "data", "--batch-size", 4, "--max-steps", 2]
    run_main(tmp_path / "out", *args)
    info = load(tmp_path / "out")["data"]
    assert info["classes"] == ["food", "sports"]
    assert "coach" in info["vocab"] and "garlic" in info["vocab"]
    train_rows, val_rows = read_metrics(tmp_path / "out")
    assert len(train_rows) == 2 and 0 <= val_rows[-1]["val_acc"] <= 1


def test_malformed_csv_is_reported_naming_the_file(tmp_path):
    (tmp_path / "data").mkdir()
    write_csv(tmp_path / "data" / "train.csv", ROWS, header=("text", "category"))
    write_csv(tmp_path / "data" / "val.csv", ROWS)
    with pytest.raises(SystemExit) as stopped:
        run_main(tmp_path / "out", "--data-dir", tmp_path / "data")
    assert "train.csv" in str(stopped.value.code), stopped.value.code
    assert not (tmp_path / "out" / "metrics.csv").exists()
