"""[acme:jsonl-log] experiment.jsonl holds one event per optimizer update and per
validation, with the numbers metrics.csv holds, and the run's config."""

import experiment_log
from conftest import read_metrics, run_main


def test_the_log_holds_every_update_and_validation(tmp_path):
    run_main(tmp_path, "--synthetic-train-size", 32, "--epochs", 2)
    events = experiment_log.read(tmp_path / "experiment.jsonl")
    assert [e["event"] for e in events[:1]] == ["start"]
    assert events[0]["config"]["epochs"] == 2
    updates = [e for e in events if e["event"] == "update"]
    assert [e["step"] for e in updates] == list(range(1, len(updates) + 1))
    _, validation = read_metrics(tmp_path)
    logged = [e for e in events if e["event"] == "validation"]
    assert [e["val_loss"] for e in logged] == [row["val_loss"] for row in validation]
    assert events[-1]["event"] == "end" and events[-1]["step"] == updates[-1]["step"]
