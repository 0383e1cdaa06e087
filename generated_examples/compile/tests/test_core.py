"""The core loop: it runs, it is reproducible, it learns, it reads each epoch in a new
order, and it rejects bad settings before training. Every scaffold project has these."""

import math

import pytest
import torch

import train
from conftest import assert_bitwise_equal, load, read_metrics, run_main


def test_a_few_steps_run_and_write_every_output(tmp_path):
    metrics = run_main(tmp_path, "--max-steps", 3)
    assert all(math.isfinite(value) for value in metrics.values()), metrics
    for name in ("config.json", "metrics.csv", "best.pt", "final.pt"):
        assert (tmp_path / name).is_file(), f"{name} was not written"
    train_rows, val_rows = read_metrics(tmp_path)
    assert [row["step"] for row in train_rows] == [1, 2, 3]
    assert val_rows and set(metrics) <= set(val_rows[-1])
    assert load(tmp_path)["step"] == 3


def test_same_seed_gives_bitwise_identical_weights(tmp_path):
    runs = {"first": 0, "again": 0, "other-seed": 1}
    for name, seed in runs.items():
        run_main(tmp_path / name, "--max-steps", 3, "--seed", seed)
    first, again, other = (load(tmp_path / name)["model"] for name in runs)
    assert_bitwise_equal(first, again)
    # the comparison can fail: another seed gives other weights
    assert any(not torch.equal(first[name], other[name]) for name in first)


def test_activation_checkpointing_changes_no_weight_and_no_buffer(
    tmp_path, monkeypatch
):
    """--activation-checkpointing sends each block through torch.utils.checkpoint (the
    calls are counted) and ends with the weights and buffers (BatchNorm's statistics)
    of a run without it: the recompute draws the same dropout, updates no buffer."""
    calls = []

    def counted(*args, **kwargs):
        calls.append(args[0])
        return recompute(*args, **kwargs)

    recompute = train.recompute
    monkeypatch.setattr(train, "recompute", counted)
    run_main(tmp_path / "kept", "--max-steps", 3)
    assert calls == []
    run_main(tmp_path / "recomputed", "--max-steps", 3, "--activation-checkpointing")
    assert calls, "no block went through torch.utils.checkpoint"
    kept, recomputed = (
        load(tmp_path / name)["model"] for name in ("kept", "recomputed")
    )
    assert_bitwise_equal(kept, recomputed)


def test_config_json_of_a_run_replays_it_bitwise(tmp_path):
    run_main(tmp_path / "a", "--max-steps", 3, "--seed", 3, "--lr", "1e-3")
    # only --config and --out-dir: every other value comes from the file
    replay = ["--config", tmp_path / "a" / "config.json", "--out-dir", tmp_path / "b"]
    train.main([str(arg) for arg in replay])
    first, again = (load(tmp_path / name) for name in ("a", "b"))
    assert again["config"] == {**first["config"], "out_dir": str(tmp_path / "b")}
    assert_bitwise_equal(first["model"], again["model"])


def test_config_file_sets_fields_and_flags_override_it(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('epochs = 2\nlr = 1\nmax-steps = 2\nout_dir = "runs/x"\n')
    cfg = train.parse_config(["--config", str(path), "--epochs", "5"])
    assert (cfg.epochs, cfg.lr, cfg.max_steps, cfg.out_dir) == (5, 1.0, 2, "runs/x")


BAD_FILES = [("bad.toml", "no_such_field = 1", "no_such_field")]
BAD_FILES += [("bad.json", '{"epochs": "3"}', "epochs")]
BAD_FILES += [("bad.toml", "epochs = [", "not valid TOML")]


@pytest.mark.parametrize("name, text, named", BAD_FILES)
def test_config_file_with_unknown_key_or_wrong_type_is_refused(
    tmp_path, capsys, name, text, named
):
    (tmp_path / name).write_text(text)
    with pytest.raises(SystemExit) as stopped:
        run_main(tmp_path / "run", "--config", tmp_path / name)
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert named in error and name in error, error
    assert not (tmp_path / "run").exists()


def test_loss_goes_down(tmp_path):
    # 32 samples, 6 epochs: the last epoch's loss well below the first's
    args = ["--synthetic-train-size", 32, "--epochs", 6, "--warmup-steps", 2]
    run_main(tmp_path, *args)
    train_rows, _ = read_metrics(tmp_path)
    first = [row["train_loss"] for row in train_rows if row["epoch"] == 1]
    last = [row["train_loss"] for row in train_rows if row["epoch"] == 6]
    assert first and last, "no training rows for epochs 1 and 6 in metrics.csv"
    assert sum(last) / len(last) < 0.8 * sum(first) / len(first), (first, last)


def test_every_epoch_sees_every_sample_once_in_a_new_order(tmp_path, monkeypatch):
    seen = []  # indices of the training samples, in the order the loop reads them
    build_datasets = train.build_datasets

    class Recording(torch.utils.data.Dataset):
        def __init__(self, dataset):
            self.dataset = dataset

        def __len__(self):
            return len(self.dataset)

        def __getitem__(self, index):
            seen.append(index)
            return self.dataset[index]

    def build_recording_datasets(cfg):
        train_set, val_set, data_info = build_datasets(cfg)
        return Recording(train_set), val_set, data_info

    monkeypatch.setattr(train, "build_datasets", build_recording_datasets)
    run_main(tmp_path, "--synthetic-train-size", 32, "--epochs", 2)
    first, second = seen[:32], seen[32:]
    assert sorted(first) == list(range(32)), "epoch 1 did not see each sample once"
    assert sorted(second) == list(range(32)), "epoch 2 did not see each sample once"
    assert first != second, "epoch 2 repeated epoch 1's order"


def test_weight_decay_spares_biases_and_normalisation_weights(tmp_path, monkeypatch):
    """AdamW decays the weight matrices, embeddings and kernels by --weight-decay, and
    never a bias or a normalisation layer's weight (as the HF Trainer and timm do)."""
    built = []
    build_optimizer = train.build_optimizer

    def recording_build_optimizer(model, *args):
        optimizer, scheduler = build_optimizer(model, *args)
        built.append((model, optimizer))
        return optimizer, scheduler

    monkeypatch.setattr(train, "build_optimizer", recording_build_optimizer)
    run_main(tmp_path, "--max-steps", 1, "--weight-decay", 0.05)
    ((model, optimizer),) = built
    rate = {
        id(p): g["weight_decay"] for g in optimizer.param_groups for p in g["params"]
    }
    assert len(rate) == len(
        list(model.parameters())
    ), "a parameter is in no group, or two"
    norms = (
        torch.nn.LayerNorm,
        torch.nn.GroupNorm,
        torch.nn.modules.batchnorm._BatchNorm,
    )
    norm_weights = {
        id(p) for m in model.modules() if isinstance(m, norms) for p in m.parameters()
    }
    kinds = set()
    for name, parameter in model.named_parameters():
        if name.endswith("bias") or id(parameter) in norm_weights:
            assert rate[id(parameter)] == 0.0, f"{name} is decayed"
            kinds.add("spared")
        elif parameter.ndim >= 2:
            assert rate[id(parameter)] == 0.05, f"{name} is not decayed"
            kinds.add("decayed")
    assert kinds == {"spared", "decayed"}, kinds


BAD_SETTINGS = [("--batch-size", "0"), ("--lr", "-1"), ("--epochs", "0")]
BAD_SETTINGS += [("--max-grad-norm", "-1")]
BAD_SETTINGS += [("--augment", "flip")]


@pytest.mark.parametrize("flag, value", BAD_SETTINGS)
def test_bad_setting_is_rejected_naming_the_flag(tmp_path, capsys, flag, value):
    with pytest.raises(SystemExit) as stopped:
        run_main(tmp_path, flag, value)
    assert stopped.value.code == 2  # argparse's usage error, before anything is built
    assert flag in capsys.readouterr().err
    assert not (tmp_path / "metrics.csv").exists()


def test_unknown_flag_is_rejected(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        run_main(tmp_path, "--no-such-flag", "1")
    assert stopped.value.code == 2
    assert "--no-such-flag" in capsys.readouterr().err
