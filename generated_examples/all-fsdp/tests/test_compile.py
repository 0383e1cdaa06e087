"""[compile] A torch.compile'd run writes checkpoints with the plain module's keys (no
`_orig_mod.` prefix), so they load into an uncompiled model.

torch.compile runs with its "eager" backend here: the same wrapper module and the same
checkpoint keys as the default backend, without the seconds of code generation."""

import torch

import train
from conftest import load, run_main


def test_compiled_run_saves_plain_module_keys(tmp_path, monkeypatch):
    compiled = []
    compile = torch.compile

    def compile_with_eager_backend(model, *args, **kwargs):
        compiled.append(model)
        return compile(model, backend="eager")

    monkeypatch.setattr(torch, "compile", compile_with_eager_backend)
    run_main(tmp_path, "--compile", "--max-steps", 1)  # one update: a single trace
    assert compiled, "--compile did not call torch.compile"
    # [fsdp] [resume] last.pt names the sharded folder that holds the model: not here
    for path in sorted(set(tmp_path.glob("*.pt")) - {tmp_path / "last.pt"}):
        checkpoint = load(tmp_path, path.name)
        wrapped = [key for key in checkpoint["model"] if "_orig_mod." in key]
        assert not wrapped, f"{path.name} has the compiled module's keys: {wrapped[:3]}"
        cfg = train.Config(**checkpoint["config"])
        model = train.build_model(cfg, checkpoint["data"])
        model.load_state_dict(checkpoint["model"])  # strict: every key and shape fits
