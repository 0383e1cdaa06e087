"""[pretrained] The backbone really starts from the pretrained weights (only the head is
new), --freeze-backbone-epochs leaves it untouched, and <out-dir>/model/ loads without
this project's code and gives the same logits. conftest.py builds the tiny stand-in
model that these runs load."""

import copy

import timm
import torch
from safetensors.torch import load_file

import train
from conftest import PRETRAINED, TINY, load, run_main


def pretrained_backbone() -> dict:
    """The backbone's tensors as the pretrained file holds them."""
    weights = load_file(str(PRETRAINED / "weights.safetensors"))
    return {k: v for k, v in weights.items() if not k.startswith("fc.")}


def split_state(model) -> tuple[dict, dict]:
    """(backbone tensors, head tensors) of a built model, named as in the files."""
    state = model.state_dict()
    backbone = {k: v for k, v in state.items() if not k.startswith("fc.")}
    return backbone, {k: v for k, v in state.items() if k.startswith("fc.")}


def train_keeping_initial_model(tmp_path, monkeypatch, *args):
    """Run train.main; return (the model before its first update, the trained one)."""
    built = []
    build_model = train.build_model

    def build_and_keep_a_copy(cfg, data_info):
        model = build_model(cfg, data_info)
        built.append(copy.deepcopy(model))
        return model

    monkeypatch.setattr(train, "build_model", build_and_keep_a_copy)
    run_main(tmp_path, *args)
    trained = copy.deepcopy(built[0])
    trained.load_state_dict(load(tmp_path)["model"])
    return built[0], trained


def test_backbone_starts_from_the_pretrained_weights_only_the_head_is_new(
    tmp_path, monkeypatch
):
    initial, _ = train_keeping_initial_model(tmp_path, monkeypatch, "--max-steps", 1)
    backbone, head = split_state(initial)
    saved = pretrained_backbone()
    assert backbone.keys() == saved.keys()
    different = [k for k in backbone if not torch.equal(backbone[k], saved[k])]
    assert not different, f"not loaded from the pretrained weights: {different[:3]}"
    assert head, "no new head"


def test_frozen_backbone_is_not_updated_but_the_head_is(tmp_path, monkeypatch):
    args = ["--epochs", 1, "--freeze-backbone-epochs", 1]
    initial, trained = train_keeping_initial_model(tmp_path, monkeypatch, *args)
    (backbone, head), (backbone_after, head_after) = map(
        split_state, (initial, trained)
    )
    # BatchNorm's running statistics follow the data in training mode, frozen or not
    backbone = {k: v for k, v in backbone.items() if "running_" not in k}
    backbone = {k: v for k, v in backbone.items() if "num_batches" not in k}
    moved = [k for k in backbone if not torch.equal(backbone[k], backbone_after[k])]
    assert not moved, f"frozen backbone tensors changed: {moved[:3]}"
    assert any(
        not torch.equal(head[k], head_after[k]) for k in head
    ), "head not trained"


def test_exported_model_loads_without_this_code_and_gives_the_same_logits(tmp_path):
    run_main(tmp_path, "--max-steps", 2)
    state = load(tmp_path)
    model = train.build_model(train.parse_config(TINY), state["data"])
    model.load_state_dict(state["model"])
    model.eval()
    folder = f"local-dir:{tmp_path / 'model'}"
    exported = timm.create_model(folder, pretrained=True).eval()
    images = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        expected, got = model(images), exported(images)
    torch.testing.assert_close(got, expected)
