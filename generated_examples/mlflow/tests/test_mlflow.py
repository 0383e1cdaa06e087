"""[mlflow] The MLflow run holds the config as parameters, the numbers of metrics.csv at
the same steps (optimizer updates) and best.pt/final.pt as artifacts.
The runs log to a SQLite store of the test session (conftest.py), never to yours."""

import mlflow
import pytest

from conftest import load, read_metrics, run_main


def metrics_csv(out_dir) -> dict:
    """metrics.csv as metric name -> [(step, value), ...], in step order."""
    series = {}
    for rows in read_metrics(out_dir):
        for row in rows:
            for name, value in row.items():
                if name not in ("step", "epoch"):
                    series.setdefault(name, []).append((int(row["step"]), value))
    return {name: sorted(points) for name, points in series.items()}


def logged(run_id: str) -> dict:
    """The MLflow run's metrics as name -> [(step, value), ...], in step order."""
    client = mlflow.MlflowClient()
    names = client.get_run(run_id).data.metrics
    return {
        name: sorted((m.step, m.value) for m in client.get_metric_history(run_id, name))
        for name in names
    }


def assert_same_series(logged_series: dict, expected: dict) -> None:
    """The same metric names, each at the same steps, with about the same values."""
    assert logged_series.keys() == expected.keys()
    for name, points in expected.items():
        steps, values = zip(*points, strict=True)
        logged_steps, logged_values = zip(*logged_series[name], strict=True)
        assert logged_steps == steps, name
        assert logged_values == pytest.approx(values), name


def test_run_holds_the_config_the_metrics_and_the_weights(tmp_path):
    run_main(tmp_path, "--synthetic-train-size", 32, "--epochs", 2)
    run = mlflow.last_active_run()
    assert run.info.status == "FINISHED"
    config = load(tmp_path)["config"]
    assert run.data.params == {name: str(value) for name, value in config.items()}
    assert_same_series(logged(run.info.run_id), metrics_csv(tmp_path))
    artifacts = mlflow.MlflowClient().list_artifacts(run.info.run_id)
    sizes = {artifact.path: artifact.file_size for artifact in artifacts}
    assert sizes == {
        name: (tmp_path / name).stat().st_size for name in ("best.pt", "final.pt")
    }
