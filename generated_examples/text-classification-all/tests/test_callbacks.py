"""[callbacks] The loop calls every hook in the order callbacks.py documents, a hook
returning True stops training, and an exception reaches on_exception, then on_train_end.

A recording callback is added to the list train.py passes to callbacks.run_hooks, so the
test sees exactly the calls your loop makes."""

import pytest

import callbacks
from conftest import load, run_main

HOOKS = ["on_train_start", "on_step_end", "on_validation_end", "on_epoch_end"]
HOOKS += ["on_exception", "on_train_end"]


class Recorder:
    """Records (hook, arguments) of every hook call; can stop, or raise, at a given
    step."""

    def __init__(self, stop_at_step=None, raise_at_step=None):
        self.calls = []
        self.stop_at_step, self.raise_at_step = stop_at_step, raise_at_step
        for hook in HOOKS:
            if hook != "on_step_end":
                setattr(self, hook, self.recorder(hook))

    def recorder(self, hook):
        return lambda **kwargs: self.calls.append((hook, kwargs))

    def on_step_end(self, **kwargs):
        self.calls.append(("on_step_end", kwargs))
        if kwargs["step"] == self.raise_at_step:
            raise RuntimeError("raised by the test")
        return kwargs["step"] == self.stop_at_step

    def arguments(self, hook):
        return [kwargs for name, kwargs in self.calls if name == hook]


@pytest.fixture
def add_recorder(monkeypatch):
    def add(recorder):
        run_hooks = callbacks.run_hooks

        def run_hooks_and_record(callback_list, hook, **kwargs):
            if recorder not in callback_list:
                callback_list.append(recorder)
            return run_hooks(callback_list, hook, **kwargs)

        monkeypatch.setattr(callbacks, "run_hooks", run_hooks_and_record)
        return recorder

    return add


def test_hooks_run_in_the_documented_order(tmp_path, add_recorder):
    recorder = add_recorder(Recorder())
    run_main(tmp_path, "--synthetic-train-size", 32, "--epochs", 2)  # 4 updates/epoch
    epoch = ["on_step_end"] * 4 + ["on_validation_end", "on_epoch_end"]
    expected = ["on_train_start", *epoch, *epoch, "on_train_end"]
    assert [hook for hook, _ in recorder.calls] == expected
    steps = recorder.arguments("on_step_end")
    assert [kwargs["step"] for kwargs in steps] == list(range(1, 9))
    for kwargs in steps:
        assert {"step", "epoch", "lr", "train_loss"} <= set(kwargs["metrics"])
    validations = recorder.arguments("on_validation_end")
    assert [kwargs["epoch"] for kwargs in validations] == [1, 2]
    assert all("val_loss" in kwargs["metrics"] for kwargs in validations)
    assert recorder.calls[-1] == ("on_train_end", {"step": 8})


def test_a_hook_returning_true_stops_training(tmp_path, add_recorder):
    recorder = add_recorder(Recorder(stop_at_step=3))
    run_main(tmp_path, "--synthetic-train-size", 32, "--epochs", 2)
    steps = [kwargs["step"] for kwargs in recorder.arguments("on_step_end")]
    # [ddp] the ranks agree on a stop in the next update's all-reduce, and
    # read it at its log step (--log-every 1): the run stops after update 4
    assert steps == [1, 2, 3, 4]
    assert load(tmp_path)["step"] == 4
    assert recorder.calls[-1][0] == "on_train_end"


def test_an_exception_reaches_on_exception_then_on_train_end(tmp_path, add_recorder):
    recorder = add_recorder(Recorder(raise_at_step=2))
    with pytest.raises(RuntimeError, match="raised by the test"):
        run_main(tmp_path, "--synthetic-train-size", 32, "--epochs", 2)
    assert [hook for hook, _ in recorder.calls[-2:]] == ["on_exception", "on_train_end"]
    assert str(recorder.calls[-2][1]["exc"]) == "raised by the test"
