"""Replay buffer of past negative samples (Du et al. 2021, Algorithm 1; Du & Mordatch 2019).

Samples are kept in float on the training device, so a sample read back is bit-identical to
the one stored (no quantisation drift across round trips), with the attribute labels they
were sampled under. Reservoir sampling keeps a uniform sample of every negative seen over
the run (the authors' choice); ``fifo`` keeps the most recent ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import torch
from torch import Tensor

Policy = Literal["reservoir", "fifo"]


class ReplayBuffer:
    """Fixed-capacity store of samples ``(N, *shape)`` and integer labels per attribute."""

    def __init__(
        self,
        capacity: int,
        shape: Sequence[int],
        attributes: Sequence[str] = (),
        device: torch.device | str = "cpu",
        policy: Policy = "reservoir",
    ) -> None:
        if capacity < 1:
            raise ValueError(f"buffer capacity must be >= 1, got {capacity}")
        if policy not in ("reservoir", "fifo"):
            raise ValueError(f"unknown buffer policy {policy!r}; valid choices: ['reservoir', 'fifo']")
        self.capacity = int(capacity)
        self.shape = tuple(shape)
        self.policy = policy
        self.device = torch.device(device)
        # one spare row past the end takes the writes of items that are not kept, so `add` never reads back which
        # ones are (on a GPU each read waits for the device); `samples` and `labels` are the rows before it
        self._samples = torch.zeros((self.capacity + 1, *self.shape), device=self.device)
        self._labels = {a: torch.zeros(self.capacity + 1, dtype=torch.long, device=self.device) for a in attributes}
        self.samples = self._samples[: self.capacity]
        self.labels = {a: store[: self.capacity] for a, store in self._labels.items()}
        self.size = 0  # items held
        self.seen = 0  # items ever offered (reservoir sampling needs it)

    def __len__(self) -> int:
        return self.size

    def add(self, x: Tensor, labels: Mapping[str, Tensor] | None, generator: torch.Generator) -> None:
        """Offer a batch ``(B, *shape)`` to the buffer."""
        if tuple(x.shape[1:]) != self.shape:
            raise ValueError(f"buffer holds samples of shape {self.shape}, got a batch of {tuple(x.shape)}")
        missing = set(self.labels) - set(labels or {})
        if missing:
            raise ValueError(f"buffer keeps labels for {sorted(self.labels)}; missing {sorted(missing)}")
        b = x.shape[0]
        items = torch.arange(b, device=self.device)
        if self.policy == "fifo":
            slots = (items + self.seen) % self.capacity
        else:
            # reservoir: item number t (0-based) is kept with probability capacity / (t + 1), in a random slot
            t = items + self.seen
            draw = (torch.rand(b, generator=generator, device=self.device) * (t + 1)).long()
            slots = torch.where(t < self.capacity, t, draw).clamp(max=self.capacity)  # capacity: not kept
        # two items of one batch may draw the same slot: the later one wins, as if added one by one; the others,
        # and the items not kept, write into the spare row
        winner = torch.full((self.capacity + 1,), -1, dtype=torch.long, device=self.device)
        winner.scatter_reduce_(0, slots, items, reduce="amax")
        slots = torch.where(winner[slots] == items, slots, self.capacity)
        self._samples[slots] = x.detach().to(self.device, self._samples.dtype)
        for attr, store in self._labels.items():
            store[slots] = labels[attr].to(self.device)
        self.seen += b
        self.size = min(self.capacity, self.size + b)

    def sample(self, n: int, generator: torch.Generator) -> tuple[Tensor, dict[str, Tensor]]:
        """``n`` items drawn uniformly with replacement: ``(n, *shape)`` and their labels."""
        if self.size == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        idx = torch.randint(self.size, (n,), generator=generator, device=self.device)
        return self.samples[idx].clone(), {a: s[idx].clone() for a, s in self.labels.items()}

    def state_dict(self) -> dict:
        """Samples, labels and counters, for checkpoints (tensors only)."""
        return {
            "samples": self.samples[: self.size].clone(),
            "labels": {a: s[: self.size].clone() for a, s in self.labels.items()},
            "seen": self.seen,
            "capacity": self.capacity,
            "policy": self.policy,
        }

    def load_state_dict(self, state: Mapping, resize: bool = False) -> None:
        """Inverse of `state_dict`. ``resize=True`` (a resume that allows a changed ``buffer_size``) takes a
        buffer of another capacity: ``fifo`` keeps the newest samples that fit, ``reservoir`` a uniform subset."""
        old_capacity = int(state["capacity"])
        if tuple(state["samples"].shape[1:]) != self.shape or (old_capacity != self.capacity and not resize):
            raise ValueError(
                f"checkpoint buffer (capacity {state['capacity']}, shape {tuple(state['samples'].shape[1:])}) does not"
                f" match this buffer (capacity {self.capacity}, shape {self.shape})"
            )
        if set(state["labels"]) != set(self.labels):
            raise ValueError(f"checkpoint buffer labels {sorted(state['labels'])} != {sorted(self.labels)}")
        held, seen = state["samples"].shape[0], int(state["seen"])
        self.size = min(held, self.capacity)
        src = torch.arange(self.size)  # reservoir slots are exchangeable: the first ones are a uniform subset
        if old_capacity != self.capacity:
            if state["policy"] == "fifo":  # the j-th newest sample sits in slot (seen - j) mod capacity
                src = (seen - torch.arange(self.size, 0, -1)) % old_capacity  # oldest first
            # held samples fill slots 0..size-1, as in a buffer that has seen only them (fifo writes next at
            # slot seen mod capacity, onto the oldest); a full reservoir keeps its count, so its odds go on
            seen = seen if state["policy"] == "reservoir" and self.size == self.capacity else self.size
        self.samples.zero_()
        self.samples[: self.size] = state["samples"][src].to(self.device)
        for attr, store in self.labels.items():
            store.zero_()
            store[: self.size] = state["labels"][attr][src].to(self.device)
        self.seen = seen
        self.policy = state["policy"]
