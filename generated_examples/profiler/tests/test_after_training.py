"""After training: evaluate.py gives the numbers training logged, predict.py agrees with
it, plot.py draws real images, and a damaged or foreign checkpoint is refused in one
line. One tiny training run on data written to disk (train, val and test splits) serves
every test here."""

import json
from pathlib import Path

import pytest
import torch
from sklearn.metrics import precision_recall_fscore_support

import data
import evaluate
import plot
import predict
from conftest import load, run_main

SIZES = {"train": 32, "val": 12, "test": 8}


def write_data(root: Path) -> Path:
    """PNG folders DATA/<split>/<class>/ drawn from the built-in images."""
    from PIL import Image

    for split, size in SIZES.items():
        seed = data.SYNTHETIC_SEEDS[split]
        images = data.SyntheticImages(size, 16, seed, transform=lambda image: image)
        for i in range(size):
            image, label = images[i]
            folder = root / split / data.SYNTHETIC_CLASSES[label]
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image.permute(1, 2, 0).numpy()).save(folder / f"{i}.png")
    return root


def inputs_of(data_dir: Path, split: str) -> list[str]:
    return [str(data_dir / split)]  # predict.py reads the folder


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, Path]:
    """(data dir, run dir) of one tiny training run of two epochs."""
    root = tmp_path_factory.mktemp("after-training")
    data_dir = write_data(root / "data")
    run_main(root / "run", "--data-dir", data_dir, "--epochs", 2)
    return data_dir, root / "run"


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def test_evaluate_on_val_gives_exactly_the_numbers_training_logged(run):
    _, run_dir = run
    logged = load(run_dir, "best.pt")["metrics"]  # what validation logged for best.pt
    results = evaluate.main([str(run_dir / "best.pt")])
    assert results["loss"] == logged["val_loss"]
    assert results["accuracy"] == logged["val_acc"]
    assert json.loads((run_dir / "eval-val.json").read_text()) == results


def test_per_class_numbers_are_scikit_learns_on_the_written_predictions(run):
    _, run_dir = run
    results = evaluate.main([str(run_dir / "best.pt")])
    rows = read_jsonl(run_dir / "eval-val-predictions.jsonl")
    assert len(rows) == results["samples"] == SIZES["val"]
    classes = list(results["per_class"])
    y_true = [row["target"] for row in rows]
    y_pred = [row["labels"][0] for row in rows]
    precision, recall, f1, support = precision_recall_fscore_support(
        y_true, y_pred, labels=classes, zero_division=0
    )
    for i, name in enumerate(classes):
        scores = results["per_class"][name]
        assert scores["precision"] == pytest.approx(precision[i], abs=1e-12)
        assert scores["recall"] == pytest.approx(recall[i], abs=1e-12)
        assert scores["f1"] == pytest.approx(f1[i], abs=1e-12)
        assert scores["support"] == support[i]
    accuracy = sum(t == p for t, p in zip(y_true, y_pred, strict=True)) / len(rows)
    assert results["accuracy"] == accuracy


def test_test_split_is_evaluated_with_a_confusion_matrix(run):
    _, run_dir = run
    results = evaluate.main([str(run_dir / "best.pt"), "--split", "test"])
    assert results["split"] == "test"
    assert results["samples"] == SIZES["test"]
    assert_png(run_dir / "eval-test-confusion.png")


def test_predict_agrees_with_evaluate(run, tmp_path):
    data_dir, run_dir = run
    evaluate.main([str(run_dir / "best.pt")])
    expected = read_jsonl(run_dir / "eval-val-predictions.jsonl")
    output = tmp_path / "preds.jsonl"
    args = [str(run_dir / "best.pt"), *inputs_of(data_dir, "val"), "--output", output]
    args += ["--top-k", "3"]
    assert predict.main([str(a) for a in args]) == 0
    rows = read_jsonl(output)
    assert len(rows) == len(expected)
    rows = sorted(rows, key=lambda row: row["input"])
    expected = sorted(expected, key=lambda row: row["input"])
    for row, want in zip(rows, expected, strict=True):
        assert row["input"] == want["input"]
        assert row["labels"] == want["labels"][:3]
        got = row["probabilities"]
        wanted = want["probabilities"][: len(got)]
        assert max(abs(a - b) for a, b in zip(got, wanted, strict=True)) <= 1e-6, row[
            "input"
        ]


def test_predict_reports_a_bad_input_by_name_and_predicts_the_rest(
    run, tmp_path, capsys
):
    data_dir, run_dir = run
    folder = tmp_path / "inputs"
    folder.mkdir()
    good = sorted((data_dir / "val").rglob("*.png"))[:2]
    for i, path in enumerate(good):
        (folder / f"{i}.png").write_bytes(path.read_bytes())
    (folder / "notes.png").write_text("not an image")
    inputs = [folder]
    bad_name = "notes.png"
    output = tmp_path / "preds.csv"
    code = predict.main(
        [str(run_dir / "best.pt"), *map(str, inputs), "--output", str(output)]
    )
    assert code == 1
    errors = capsys.readouterr().err
    assert bad_name in errors and "skipped" in errors, errors
    assert (
        len(output.read_text().splitlines()) == 1 + 2
    )  # header and the two good inputs


def assert_png(path: Path) -> None:
    """A real PNG of non-trivial size."""
    from matplotlib.image import imread

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    height, width = imread(path).shape[:2]
    assert height >= 200 and width >= 200, (path, height, width)


def test_training_draws_its_curves_and_plot_overlays_runs(run, tmp_path):
    _, run_dir = run
    assert_png(run_dir / "curves.png")
    plot.main([str(run_dir), str(run_dir), "--out", str(tmp_path / "both.png")])
    assert_png(tmp_path / "both.png")
    with pytest.raises(SystemExit) as stopped:
        plot.main([str(tmp_path)])  # no metrics.csv here
    message = str(stopped.value.code)
    assert message.startswith("error: ") and "metrics.csv" in message
    assert "\n" not in message


def test_damaged_or_foreign_checkpoint_is_refused_in_one_line(run, tmp_path):
    _, run_dir = run
    damaged = tmp_path / "damaged.pt"
    damaged.write_bytes((run_dir / "best.pt").read_bytes()[:1000])
    foreign = tmp_path / "foreign.pt"
    other_task = {"tags": ["O", "B-X"], "vocab": ["<pad>", "<unk>"]}
    torch.save({"model": {}, "config": {}, "data": other_task}, foreign)
    for checkpoint in (damaged, foreign, tmp_path / "missing.pt"):
        for script in (evaluate, predict):
            with pytest.raises(SystemExit) as stopped:
                script.main([str(checkpoint), *(["-"] if script is predict else [])])
            message = str(stopped.value.code)
            assert message.startswith(f"error: {checkpoint}"), message
            assert "\n" not in message
    assert not list(tmp_path.glob("eval-*")), "a refused checkpoint wrote results"
