"""[fsdp] What test_fsdp.py starts on each rank under torchrun: your train.main(), with
the gradient and lr of every update saved by rank 0 (each rank holds a shard of the
gradient; UpdateRecorder gathers the whole of it).

    torchrun --nproc-per-node 2 tests/fsdp_worker.py UPDATES.pt [FLAGS...]
"""

import os
import sys
from pathlib import Path

# the project folder first, so train.py, model.py and data.py import as for
# `python train.py`
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import train  # noqa: E402
from conftest import UpdateRecorder, batch_independent, sample_your_data  # noqa: E402

if __name__ == "__main__":
    updates_path, args = sys.argv[1], sys.argv[2:]
    sample_your_data(setattr)  # with `pytest --data-dir=DATA`, a sample of DATA
    args += batch_independent(setattr, augment=False)
    with UpdateRecorder() as updates:
        train.main(args)
    if os.environ.get("RANK", "0") == "0":
        torch.save({"grads": updates.grads, "lrs": updates.lrs}, updates_path)
