"""Your data on disk: the format README.md describes loads and trains, and a broken data
set stops the run before training, naming what is wrong. Each test writes its own tiny
data set."""

import shutil

import pytest

from conftest import load, read_metrics, run_main


def write_image_folders(root, classes=("cat", "dog"), per_class=3):
    """DATA/{train,val}/<class>/*.png: one plain colour per class, assorted sizes."""
    from PIL import Image

    colours = [(220, 40, 40), (40, 40, 220), (40, 200, 40)]
    for split in ("train", "val"):
        for label, name in enumerate(classes):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(per_class):
                size = (12 + 4 * i, 20 - 2 * i)
                Image.new("RGB", size, colours[label]).save(folder / f"{i}.png")


def test_png_image_folders_load_and_train(tmp_path):
    write_image_folders(tmp_path / "data")
    args = ["--data-dir", tmp_path / "data", "--batch-size", 4, "--max-steps", 2]
    run_main(tmp_path / "out", *args)
    # the classes are the folder names
    assert load(tmp_path / "out")["data"]["classes"] == ["cat", "dog"]
    train_rows, val_rows = read_metrics(tmp_path / "out")
    assert len(train_rows) == 2 and 0 <= val_rows[-1]["val_acc"] <= 1


def test_missing_split_is_reported_before_training(tmp_path):
    write_image_folders(tmp_path / "data")
    shutil.rmtree(tmp_path / "data" / "val")
    with pytest.raises(SystemExit) as stopped:
        run_main(tmp_path / "out", "--data-dir", tmp_path / "data")
    assert "val" in str(stopped.value.code), stopped.value.code
    assert not (tmp_path / "out" / "metrics.csv").exists()
