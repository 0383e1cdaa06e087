"""[sweep] A 3-trial sweep over the built-in data finishes, with one --out-dir per trial
and every trial's per-epoch metric reported to Optuna; the best trial's config is a file
that train.py --config accepts; a sweep cut off in a trial continues the same study."""

import optuna
import pytest
from optuna.trial import TrialState

import sweep
import train
from conftest import TINY, load

SMALL = [*TINY, "--synthetic-train-size", 32, "--epochs", 2]
del SMALL[SMALL.index("--batch-size") : SMALL.index("--batch-size") + 2]  # searched


def run_sweep(tmp_path, *args) -> optuna.Study:
    storage, out_dir = tmp_path / "sweep.db", tmp_path / "runs"
    argv = ["--storage", storage, "--out-dir", out_dir, *SMALL, *args]
    return sweep.main([str(arg) for arg in argv])


def test_three_trials_finish_and_the_best_config_replays(tmp_path):
    study = run_sweep(tmp_path, "--n-trials", 3)
    trials = study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))
    assert len(trials) == 3
    for trial in trials:
        out_dir = tmp_path / "runs" / f"trial-{trial.number:04d}"
        config = load(out_dir)["config"]
        for name, value in trial.params.items():
            assert config[name] == value, (name, config[name], value)
        assert sorted(trial.intermediate_values) in ([1], [1, 2]), "no epoch reported"
    best = tmp_path / "runs" / "best.json"
    cfg = train.parse_config(["--config", str(best)])
    for name, value in study.best_trial.params.items():
        assert getattr(cfg, name) == value


def test_an_interrupted_sweep_continues_the_study(tmp_path):
    run_sweep(tmp_path, "--n-trials", 1)
    # a sweep killed inside its second trial leaves that trial RUNNING in the study
    study = optuna.load_study(
        study_name="sweep", storage=f"sqlite:///{tmp_path}/sweep.db"
    )
    cut_off = study.ask()
    study = run_sweep(tmp_path, "--n-trials", 2)
    states = {trial.number: trial.state for trial in study.get_trials()}
    assert states == {
        0: TrialState.COMPLETE,
        cut_off.number: TrialState.FAIL,
        2: states[2],
    }
    assert states[2] in (TrialState.COMPLETE, TrialState.PRUNED)


def test_a_search_over_an_unknown_field_is_refused_before_anything_is_written(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(sweep, "search_space", lambda trial: {"no_such_field": 1})
    with pytest.raises(SystemExit) as stopped:
        run_sweep(tmp_path, "--n-trials", 1)
    assert stopped.value.code == 2
    assert "no_such_field" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
