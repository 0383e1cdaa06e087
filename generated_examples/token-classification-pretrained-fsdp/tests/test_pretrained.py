"""[pretrained] The backbone really starts from the pretrained weights (only the head is
new), --freeze-backbone-epochs leaves it untouched, and <out-dir>/model/ loads without
this project's code and gives the same logits. conftest.py builds the tiny stand-in
model that these runs load."""

import copy

import torch
from transformers import AutoModel, AutoTokenizer
from transformers import AutoModelForTokenClassification as AutoModelForTask

import train
from conftest import PRETRAINED, TINY, load, run_main


def pretrained_backbone() -> dict:
    """The backbone's tensors as the pretrained files hold them."""
    return AutoModel.from_pretrained(PRETRAINED).state_dict()


def split_state(model) -> tuple[dict, dict]:
    """(backbone tensors, head tensors) of a built model, named as in the files."""
    backbone = model.transformer.base_model.state_dict()
    ids = {id(v) for v in backbone.values()}
    state = model.state_dict(keep_vars=True)
    head = {k: v.detach() for k, v in state.items() if id(v) not in ids}
    return backbone, head


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
    # (a token classifier has no pooler: its backbone is the saved one minus that)
    assert backbone and backbone.keys() <= saved.keys()
    different = [k for k in backbone if not torch.equal(backbone[k], saved[k])]
    assert not different, f"not loaded from the pretrained weights: {different[:3]}"
    assert head, "no new head"


def test_frozen_backbone_is_not_updated_but_the_head_is(tmp_path, monkeypatch):
    args = ["--epochs", 1, "--freeze-backbone-epochs", 1]
    initial, trained = train_keeping_initial_model(tmp_path, monkeypatch, *args)
    (backbone, head), (backbone_after, head_after) = map(
        split_state, (initial, trained)
    )
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
    exported = AutoModelForTask.from_pretrained(tmp_path / "model").eval()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "model")
    tokens = tokenizer(
        ["alice met bob in paris", "the team"], padding=True, return_tensors="pt"
    )
    with torch.no_grad():
        expected = model(tokens["input_ids"])
        got = exported(**tokens).logits
    assert exported.config.id2label == dict(enumerate(state["data"]["tags"]))
    torch.testing.assert_close(got, expected)
