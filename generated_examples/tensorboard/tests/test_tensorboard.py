"""[tensorboard] The event files under <out-dir>/tb hold the numbers of metrics.csv,
with the optimizer update as the global step, and the config as text."""

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import read_metrics, run_main


def test_event_files_hold_the_metrics_csv_numbers(tmp_path):
    run_main(tmp_path, "--synthetic-train-size", 32, "--epochs", 2)
    assert list((tmp_path / "tb").glob("events.out.tfevents.*")), "no event file in tb/"
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    for rows in read_metrics(tmp_path):
        for name in rows[0]:
            if name in ("step", "epoch", "samples_per_s"):
                continue
            logged = events.Scalars(name)
            assert [e.step for e in logged] == [row["step"] for row in rows], name
            for event, row in zip(
                logged, rows, strict=True
            ):  # float32 in the event file
                assert abs(event.value - row[name]) <= 1e-6 * max(1, abs(row[name]))
    assert any(tag.startswith("config") for tag in events.Tags()["tensors"])
