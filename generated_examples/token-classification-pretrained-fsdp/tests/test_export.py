"""[export] Each format round-trips: the written file, loaded by its own runtime, gives
PyTorch's outputs (to 1e-4) on real validation inputs, for another batch size than
the export's."""

import json

import onnxruntime
import pytest
import torch
from torch.utils.data import DataLoader
from transformers import AutoTokenizer  # [pretrained]

import export
from conftest import run_main
from data import Collate, build_eval_set, load_tokenizer  # [pretrained]
from model import load_trained


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("export-run")
    run_main(out_dir, "--max-steps", 2)
    return out_dir / "best.pt"


# torch.jit.load warns that TorchScript is deprecated; it still works
@pytest.mark.filterwarnings("ignore:`torch.jit:FutureWarning")
@pytest.mark.parametrize("fmt", ["onnx", "torchscript", "exported-program"])
def test_exported_model_gives_pytorchs_outputs(checkpoint, fmt, tmp_path):
    max_diff = export.main(
        [str(checkpoint), "--format", fmt, "--out-dir", str(tmp_path)]
    )
    assert max_diff <= export.TOLERANCE
    path = tmp_path / export.FILES[fmt]

    # an independent check: real inputs, a batch of 3, the file's own runtime
    model, cfg, data_info = load_trained(checkpoint, torch.device("cpu"))
    tokenizer = load_tokenizer(cfg)  # [pretrained]
    dataset, _ = build_eval_set(cfg, data_info, "val", tokenizer)  # [pretrained]
    collate = Collate(tokenizer)  # [pretrained]
    inputs, _ = next(iter(DataLoader(dataset, batch_size=3, collate_fn=collate)))
    with torch.no_grad():
        expected = model(inputs)
        if fmt == "onnx":
            session = onnxruntime.InferenceSession(
                path, providers=["CPUExecutionProvider"]
            )
            input_name = session.get_inputs()[0].name
            got = torch.from_numpy(session.run(None, {input_name: inputs.numpy()})[0])
        elif fmt == "torchscript":
            got = torch.jit.load(path)(inputs)
        else:
            got = torch.export.load(path).module()(inputs)
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() <= 1e-4

    preprocessing = json.loads((tmp_path / "preprocessing.json").read_text())
    # [pretrained] the tokenizer beside the model gives training's ids; the labels
    saved = AutoTokenizer.from_pretrained(tmp_path)
    text = "alice visited paris"
    assert saved(text)["input_ids"] == tokenizer(text)["input_ids"]
    labels = "tags"
    assert preprocessing[labels] == data_info[labels]


def test_a_checkpoint_of_another_task_is_refused(tmp_path):
    other_task = {"classes": ["a", "b"], "vocab": ["<pad>", "<unk>"]}
    torch.save({"model": {}, "config": {}, "data": other_task}, tmp_path / "other.pt")
    with pytest.raises(SystemExit) as stopped:
        export.main([str(tmp_path / "other.pt"), "--format", "onnx"])
    assert str(stopped.value.code).startswith("error: ")
    assert not (tmp_path / "export").exists()
