"""The generated loop waits for the GPU only where the user asked for a number (issue 22): at
non-log updates nothing reads a device tensor on the host (bf16 and fp32).

No GPU is needed to prove it. tests/sync_counter.py runs a generated `train.main()` under a
TorchFunctionMode that knows which tensors WOULD live on the GPU: the results of `.to(device)`
and of factories given a device (called by the loop), the model's parameters, and everything
computed from them. Reading one of those on the host (`.item()`, `.tolist()`, `bool()`, `float()`,
`int()`, `.numpy()`) or calling `torch.cuda.synchronize()` is a host-device sync on a GPU; the
DataLoader's CPU tensors (the labels, a token count taken before the copy) are not. Each sync is
attributed to the interval between two optimizer steps; the intervals after a non-log update
must hold none. A loop that reads the loss every update (`loss.item()`) fails here.
"""

from __future__ import annotations

import pytest

from conftest import TINY, run_jobs
from scaffold.examples import ROOT

pytestmark = pytest.mark.slow

LOG_EVERY = 4
# one epoch of 12 updates (96 samples / batch 8): validation only after the last update
ARGS = [*TINY, "--batch-size", "8", "--epochs", "1", "--log-every", str(LOG_EVERY)]
CASES = {
    "minimal": [],
    "amp+grad-accum": ["--precision", "bf16", "--grad-accum-steps", "2", "--batch-size", "4"],

    "all-fsdp": ["--precision", "fp32", "--no-compile", "--checkpoint-every", "1000",
                 "--activation-checkpointing"],
    "token-classification-all": ["--precision", "bf16", "--no-compile", "--grad-accum-steps", "2",
                                 "--batch-size", "4"],
}


@pytest.fixture(scope="module")
def counted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("no-sync")
    jobs = [{"project": ROOT / name, "args": [*ARGS, *extra, "--out-dir", str(tmp / name)],
             "sync_counter": True} for name, extra in CASES.items()]
    return dict(zip(CASES, run_jobs(jobs, tmp)))


@pytest.mark.parametrize("name", list(CASES))
def test_no_host_sync_at_non_log_updates(counted, name):
    result = counted[name]
    assert result["ok"], f"{name}: {result['error']}\n{result['stdout']}"
    per_interval = result["syncs"]  # [n] = syncs between optimizer step n+1 and n+2
    assert len(per_interval) >= 11, per_interval
    for n, syncs in enumerate(per_interval[:-1], 1):  # after update n, up to update n+1's step
        if n % LOG_EVERY:
            assert not syncs, f"{name}: after update {n} (not a log step): {syncs}"
    # the counter sees syncs where they are asked for: the log steps read the loss
    assert any(per_interval[n - 1] for n in range(LOG_EVERY, len(per_interval), LOG_EVERY))
