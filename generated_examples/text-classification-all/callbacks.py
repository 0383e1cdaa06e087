"""[callbacks] Plain objects whose methods train.py calls at fixed points of the loop.

A callback is any object with some of these methods (all keyword arguments); a missing
method is simply not called. train.py calls them in this order:

    on_train_start(cfg, step)
        once, before the first update
    on_step_end(step, metrics)
        after every optimizer update; metrics has step, epoch, lr, and on logging
        steps (--log-every) train_loss and samples_per_s: the loss is read from the
        device there only, so the GPU never waits in between
    on_validation_end(epoch, step, metrics)
        after each validation (val_loss, val_acc, ...)
    on_epoch_end(epoch, step)
        after each epoch, after validation
    on_exception(exc)
        if the loop raises an Exception; it then propagates
    on_train_end(step)
        always, last, also after an exception

on_step_end and on_validation_end may return True to stop training: the loop finishes
the current update, validates (if it has not just done so), calls on_epoch_end and
on_train_end, and writes final.pt as at a normal end. To add your own, write a class
here and append an instance to `callbacks` in train.py:

    class PrintLoss:
        def on_step_end(self, step, metrics):
            if "train_loss" in metrics:  # a logging step
                print(step, metrics["train_loss"])
"""

import time


def run_hooks(callbacks: list, hook: str, **kwargs) -> bool:
    """Call `hook` on each callback that defines it; True if any of them asked to
    stop."""
    stop = False
    for callback in callbacks:
        method = getattr(callback, hook, None)
        if method is not None and method(**kwargs):
            stop = True
    return stop


class ThroughputMonitor:
    """Prints the learning rate and updates per second every `every` updates."""

    def __init__(self, every: int = 50):
        self.every = every
        self.last_time = self.last_step = None

    def on_train_start(self, cfg, step):
        self.last_time, self.last_step = time.perf_counter(), step

    def on_step_end(self, step, metrics):
        if step % self.every == 0:
            now = time.perf_counter()
            rate = (step - self.last_step) / (now - self.last_time)
            print(f"step {step}: lr {metrics['lr']:.3g}, {rate:.1f} updates/s")
            self.last_time, self.last_step = now, step


class TimeLimit:
    """Stops training cleanly (after the current update) once `max_hours` have passed,
    so a run that must fit a job's time slot still validates and writes final.pt. 0: no
    limit."""

    def __init__(self, max_hours: float):
        self.max_seconds = max_hours * 3600
        self.start = None

    def on_train_start(self, cfg, step):
        self.start = time.perf_counter()

    def on_step_end(self, step, metrics):
        if self.max_seconds and time.perf_counter() - self.start > self.max_seconds:
            print(f"step {step}: time limit (--max-hours) reached, stopping")
            return True
        return False
