"""[wandb] The W&B run holds the config and the numbers of metrics.csv at the same steps
(optimizer updates); --wandb-artifacts adds best.pt and final.pt.
[resume] A run stopped by SIGTERM and resumed continues the same W&B run, no step twice.
The runs are offline (conftest.py): no account, no network. The test reads what W&B
wrote under <out-dir>/wandb (an offline-run-* folder per start; `wandb sync` uploads).
"""

import json
import os  # [resume]
import signal  # [resume]
import struct
import time

import pytest  # [resume]
from wandb.proto import wandb_internal_pb2

from conftest import UpdateRecorder, load, read_metrics, run_main  # [resume]


def records(path):
    """The records of a .wandb file: LevelDB's log format (32 KiB blocks of chunks with
    a 7-byte header) after a 7-byte file header, each record a protobuf message."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    position, block, payload = 7, 32768, b""
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a header
            position += block - position % block
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[position : position + 7])
        payload += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a whole record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(payload)
            yield record
            payload = b""


def read_offline_runs(out_dir) -> tuple[set, dict, dict, list]:
    """Run ids, config, metric name -> [(step, value), ...] and artifact names of every
    offline-run-* folder under <out-dir>/wandb, in the order they were written."""
    run_ids, config, series, artifacts = set(), {}, {}, []
    for path in sorted(out_dir.glob("wandb/offline-run-*/run-*.wandb")):
        # W&B's service process writes the file: wait for the run's exit record
        deadline = time.monotonic() + 60
        while not any(r.WhichOneof("record_type") == "exit" for r in records(path)):
            assert time.monotonic() < deadline, f"{path} has no exit record"
            time.sleep(0.1)
        for record in records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run_ids.add(record.run.run_id)
                for item in record.run.config.update:
                    config[item.key] = json.loads(item.value_json)
            elif kind == "history":
                for item in record.history.item:
                    name = item.key or "/".join(item.nested_key)
                    if not name.startswith("_"):  # W&B's own _step, _runtime, ...
                        point = (record.history.step.num, json.loads(item.value_json))
                        series.setdefault(name, []).append(point)
            elif kind == "artifact":
                artifacts += [entry.path for entry in record.artifact.manifest.contents]
    return run_ids, config, series, artifacts


def metrics_csv(out_dir) -> dict:
    """metrics.csv as metric name -> [(step, value), ...], in step order."""
    series = {}
    for rows in read_metrics(out_dir):
        for row in rows:
            for name, value in row.items():
                if name not in ("step", "epoch"):
                    series.setdefault(name, []).append((int(row["step"]), value))
    return {name: sorted(points) for name, points in series.items()}


def test_run_holds_the_config_the_metrics_and_the_weights(tmp_path):
    run_main(tmp_path, "--synthetic-train-size", 32, "--epochs", 2, "--wandb-artifacts")
    run_ids, config, series, artifacts = read_offline_runs(tmp_path)
    assert len(run_ids) == 1
    assert {k: v for k, v in config.items() if k != "_wandb"} == load(tmp_path)[
        "config"
    ]
    assert {name: sorted(points) for name, points in series.items()} == metrics_csv(
        tmp_path
    )
    assert sorted(artifacts) == ["best.pt", "final.pt"]


def test_stopped_and_resumed_run_continues_the_run_no_step_twice(tmp_path):
    """[resume] Stopped by SIGTERM mid-epoch, then resumed from last.pt."""
    args = ["--synthetic-train-size", 32, "--epochs", 3, "--checkpoint-every", 1000]

    def stop_before(update):
        if update == 6:  # the middle of epoch 2 (4 updates per epoch)
            os.kill(os.getpid(), signal.SIGTERM)

    with UpdateRecorder(on_update=stop_before), pytest.raises(SystemExit):
        run_main(tmp_path, *args)
    (stopped_id,), _, _, _ = read_offline_runs(tmp_path)
    assert load(tmp_path, "last.pt")["wandb_run_id"] == stopped_id
    run_main(tmp_path, *args)  # resumes from last.pt
    run_ids, _, series, _ = read_offline_runs(tmp_path)
    assert run_ids == {stopped_id}
    assert len(list(tmp_path.glob("wandb/offline-run-*"))) == 2  # one folder per start
    for name, points in series.items():
        steps = [step for step, _ in points]
        assert len(steps) == len(set(steps)), f"{name} logged twice at a step: {steps}"
    assert {name: sorted(points) for name, points in series.items()} == metrics_csv(
        tmp_path
    )
