"""Run a training script and stop it the moment its first optimizer update has finished.

    BENCH_FIRST_STEP_FILE=PATH python benchmarks/_first_step.py SCRIPT [ARGS...]

The script runs as `python SCRIPT ARGS` would run it (as __main__, its folder first on sys.path).
A global optimizer-step hook writes time.time() to PATH after the first optimizer.step() and
ends the process at once (os._exit: teardown is not part of "start-up"). The caller subtracts the
time it started the process. The same wrapper serves the generated train.py and Lightning.
"""

import os
import runpy
import sys
import time

out = os.environ["BENCH_FIRST_STEP_FILE"]
script = os.path.abspath(sys.argv[1])
sys.argv = [script, *sys.argv[2:]]
sys.path[0] = os.path.dirname(script)

# Importing torch here instead of in the script moves that cost, it does not add any.
from torch.optim.optimizer import register_optimizer_step_post_hook


def first_step(optimizer, args, kwargs):
    with open(out, "w") as f:
        f.write(repr(time.time()))
    os._exit(0)


register_optimizer_step_post_hook(first_step)
runpy.run_path(script, run_name="__main__")
sys.exit("error: the script ended without an optimizer update")
