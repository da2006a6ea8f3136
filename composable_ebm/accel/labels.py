"""Label checks that read nothing back from the device: a chain's labels are checked once, not at every step.

An energy checks that its label indices are in range (`Energy.encode_labels`). On a GPU, reading a tensor's values
back waits for the device's queue, and a chain evaluates its energy with one labels tensor at every step: the range
of a tensor is read once and remembered by the tensor's identity and version (`index_range`); an integer is filled
in on the device, never copied there (`as_index`); and while a CUDA graph is captured or ``torch.compile`` traces
(`capturing`) nothing is read back, the compiled graph checking its labels as it runs (`check_indices`).
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral
from typing import Any

import torch
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary


def as_index(value: Any, device: torch.device) -> Tensor:
    """A label value (an integer, an integer tensor or a sequence of integers) as a long tensor on ``device``; an
    integer is filled in on the device rather than copied there, so a chain captured in a CUDA graph can bind one."""
    if isinstance(value, Integral):
        return torch.full((), int(value), dtype=torch.long, device=device)
    return torch.as_tensor(value, device=device).long()


_RANGES: WeakIdKeyDictionary = WeakIdKeyDictionary()  # index tensor -> (its version, smallest, largest)


def index_range(idx: Tensor) -> tuple[int, int]:
    """The smallest and largest entry of a non-empty integer tensor, read back to the host once per tensor (again
    only after an in-place change). A chain evaluates its energy with one labels tensor at every step, and on a GPU
    each read waits for the device to finish its queue."""
    known = None if idx.is_inference() else _RANGES.get(idx)
    if known is not None and known[0] == idx._version:
        return known[1], known[2]
    low, high = torch.stack(torch.aminmax(idx)).tolist()
    _remember_range(idx, low, high)
    return low, high


def _remember_range(idx: Tensor, low: int, high: int) -> None:
    """Record ``idx``'s range for `index_range`, unless it is an inference tensor (no version counter to tell a
    changed tensor by: it is read every time)."""
    if not idx.is_inference():
        _RANGES[idx] = (idx._version, low, high)


def capturing() -> bool:
    """Whether a CUDA graph is being captured on the current stream (`composable_ebm.accel.graphs`), or the code
    is being traced by ``torch.compile``: checks that read a value back to the host (label indices in range) are
    skipped then. The eager run before a capture made them; a compiled graph checks its labels as it runs
    (`Energy.encode_labels`)."""
    return torch.compiler.is_compiling() or (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def label_range(value: Any, index: Tensor, idx: Tensor) -> tuple[int, int] | None:
    """The smallest and largest index of a label given as ``value`` (``index`` as a tensor, ``idx`` broadcast to the
    batch), or ``None`` where it is not checked: an empty batch, or a CUDA graph being captured (the eager run before
    the capture checked it). An integer is read as it is, a tensor by `index_range`; the broadcast view is recorded
    with the same range, so the network's own check (`index_range` again) reads nothing back."""
    if isinstance(value, Integral):
        found = (int(value), int(value))
    elif index.numel() == 0 or capturing():
        return None
    else:
        found = index_range(index)
    if idx is not index:
        _remember_range(idx, *found)
    return found


def check_indices(attr: str, values: Sequence[str], value: Any, index: Tensor, idx: Tensor, null: int) -> None:
    """Refuse label indices of ``attr`` outside ``null .. len(values) - 1`` (``value`` as given, ``index`` as a
    tensor, ``idx`` broadcast to the batch): a ``ValueError`` eagerly, a ``RuntimeError`` in a compiled graph (on a
    GPU, a device-side assertion), nothing while a CUDA graph is captured (the eager run before it checked)."""
    message = (f"labels[{attr!r}] holds an index outside 0..{len(values) - 1} (or {null}, unbound); valid values:"
               f" {list(values)}")
    found = label_range(value, index, idx)
    if found is not None and (found[0] < null or found[1] >= len(values)):
        raise ValueError(message)
    if found is None and torch.compiler.is_compiling():  # a compiled graph reads nothing back: checked in it
        torch._assert_async(((idx >= null) & (idx < len(values))).all(), message)
