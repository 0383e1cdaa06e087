"""Count the host-device synchronisations a training loop WOULD make on a GPU, on the CPU.

`SyncCounter` is a TorchFunctionMode that follows which tensors would live on the device:
- seeds: the result of `.to(...)` given a device, of a factory (`torch.zeros`, `torch.tensor`...)
  given `device=`, both called from train.py (torch's own CPU tensors, such as the optimizer's step
  counts, stay host tensors), and every parameter and buffer of a module moved with `Module.to`;
- every torch op with a device tensor among its inputs makes device tensors (in-place ones too).
The DataLoader's tensors stay host tensors until the loop copies them. Reading a device tensor
on the host (`.item()`, `.tolist()`, `bool()`, `float()`, `int()`, `.numpy()`) and
`torch.cuda.synchronize()` count as syncs. An optimizer step pre-hook cuts the run into
intervals: `intervals[n]` lists the syncs (with the reading line) between step n+1 and step n+2.
Backward runs in C++: gradients are seeded at each optimizer step (before it runs).
"""

from __future__ import annotations

import sys
import weakref

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__float__,
         torch.Tensor.__int__, torch.Tensor.__index__, torch.Tensor.numpy}


class SyncCounter(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self._device = {}  # id(tensor) -> weakref: the tensors that would be on the GPU
        self.intervals: list[list[str]] = []
        self._steps = 0

    # --- which tensors are device tensors -----------------------------------------------------

    def _mark(self, tensor) -> None:
        if isinstance(tensor, torch.Tensor):
            self._device[id(tensor)] = weakref.ref(tensor)

    def _on_device(self, tensor) -> bool:
        ref = self._device.get(id(tensor)) if isinstance(tensor, torch.Tensor) else None
        return ref is not None and ref() is tensor

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in READS and args and self._on_device(args[0]) and self._steps:
            self.intervals[-1].append(f"{getattr(func, '__name__', func)} at {_caller()}")
        out = func(*args, **kwargs)
        inputs, _ = tree_flatten((args, kwargs))
        seeded = ("device" in kwargs or (
            func is torch.Tensor.to and any(isinstance(a, (torch.device, str)) for a in args[1:]))
        ) and _direct_caller() == "train.py"  # the loop's own copies and device tensors
        if seeded or any(self._on_device(t) for t in inputs):
            for tensor in tree_flatten(out)[0]:
                self._mark(tensor)
        return out

    # --- intervals between optimizer steps ----------------------------------------------------

    def _step(self, optimizer, args, kwargs) -> None:
        self._steps += 1
        self.intervals.append([])
        for group in optimizer.param_groups:
            for p in group["params"]:
                self._mark(p)
                if p.grad is not None:
                    self._mark(p.grad)

    def __enter__(self):
        self._handle = register_optimizer_step_pre_hook(self._step)
        self._module_to = torch.nn.Module.to
        counter = self

        def module_to(module, *args, **kwargs):
            result = counter._module_to(module, *args, **kwargs)
            for tensor in [*module.parameters(), *module.buffers()]:
                counter._mark(tensor)
            return result

        torch.nn.Module.to = module_to
        self._cuda_sync = torch.cuda.synchronize

        def synchronize(*args, **kwargs):
            if counter._steps:
                counter.intervals[-1].append(f"torch.cuda.synchronize at {_caller()}")
            return counter._cuda_sync(*args, **kwargs)

        torch.cuda.synchronize = synchronize
        return super().__enter__()

    def __exit__(self, *exc_info):
        self._handle.remove()
        torch.nn.Module.to = self._module_to
        torch.cuda.synchronize = self._cuda_sync
        return super().__exit__(*exc_info)


def _caller() -> str:
    """The first frame outside torch and this file: the line that asked for the number."""
    frame = sys._getframe(2)
    while frame and ("/torch/" in frame.f_code.co_filename or frame.f_code.co_filename == __file__):
        frame = frame.f_back
    return f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno}" if frame else "?"


def _direct_caller() -> str:
    """The file that called the torch function (torch's own Python wrappers skipped)."""
    frame = sys._getframe(2)
    while frame and (frame.f_code.co_filename == __file__
                     or frame.f_code.co_filename.endswith(("torch/overrides.py", "torch/_tensor.py"))):
        frame = frame.f_back
    return frame.f_code.co_filename.rsplit("/", 1)[-1] if frame else "?"
