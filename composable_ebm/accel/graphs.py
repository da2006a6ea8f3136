"""Chains replayed from CUDA graphs: a run of identical transitions is captured once and replayed step by step.

On a GPU the small networks' chains are bound by kernel launches, not arithmetic (docs/benchmarks.md, "Throughput
... on CUDA"): a transition is dozens of small kernels, each launched from Python. A CUDA graph records one
transition's kernels once and launches them all with one call. The chain's randomness stays the run's generator's
(it is registered with the graph, so each replay draws what the eager step would have drawn next).

It applies where every one of these holds, and the chain runs eagerly otherwise, with the same results:

- the run asks for it: `composable_ebm.accel.settings.Speed.cuda_graphs`, on unless the environment variable
  ``CEBM_CUDA_GRAPHS=0`` says otherwise when the run starts;
- the chain is on a CUDA device and at least `MIN_STEPS` transitions run with one setting;
- the capture succeeds. It fails, for instance, for an energy that reads a value back to the host inside its
  forward; the chain then runs eagerly (its generator draws on as it would have), that energy is not captured
  again, and a warning says why, once per kind of energy. (The energies' own checks
  that read back, label indices in range, are skipped while a graph is captured: `composable_ebm.accel.labels.capturing`;
  the first transition ran them eagerly.)

A captured graph is kept with its energy and reused while the energy's parameters stay where they were (an optimiser
updates them in place; moving the model to another device makes a new graph), and the batch shape, the settings, the
generator (the same object: a trainer's, not a new one per `sample` call) and the labels' names stay the same.
Labels are copied into the graph's own buffers before each run.

`capture` is the capture itself (warm-up, the generator registered, its state left as before), which the trainer
also uses for a denoising iteration's loss and backward pass. The chains' loop (`composable_ebm.sampling.chain`) asks
`replayer` for a graph; this module knows neither chains nor energies (it captures whatever step it is handed).
"""

from __future__ import annotations

import dataclasses
import warnings
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import torch

T = TypeVar("T")

MIN_STEPS = 8
"""fewer identical transitions than this run eagerly: the capture costs about three eager transitions"""
MAX_GRAPHS_PER_ENERGY = 4

_cache: weakref.WeakKeyDictionary[Any, dict[tuple, _Graph]] = weakref.WeakKeyDictionary()
_failed: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()  # energies whose capture failed
_warned: set[str] = set()


class _Graph:
    """One transition captured for one energy, batch shape, setting, generator and set of labels: its state buffers
    are advanced in place by each replay."""

    def __init__(self, step_fn: Callable, energy: Any, state: Any, config: Any,
                 generator: torch.Generator, labels: Any) -> None:
        self.generator = generator  # held, so no later generator takes its id while the graph is kept
        self.state = dataclasses.replace(state, x=state.x.detach().clone(), energy=state.energy.detach().clone(),
                                         grad=state.grad.detach().clone())
        self.labels = ({k: torch.as_tensor(v, device=state.x.device).clone() for k, v in labels.items()}
                       if labels else None)

        def transition() -> Any:
            new, info = step_fn(energy, self.state, config, generator, self.labels)
            self.state.x.copy_(new.x)
            self.state.energy.copy_(new.energy)
            self.state.grad.copy_(new.grad)
            return info

        self.graph, self.info = capture(transition, generator, state.x.device)  # `load` sets the state before a run

    def load(self, state: Any, labels: Any) -> None:
        self.state.x.copy_(state.x)
        self.state.energy.copy_(state.energy)
        self.state.grad.copy_(state.grad)
        for name, buffer in (self.labels or {}).items():
            buffer.copy_(torch.as_tensor(labels[name], device=buffer.device).expand_as(buffer))

    def replay(self) -> None:
        """One transition: the state buffers advance in place."""
        self.graph.replay()

    def snapshot(self) -> tuple[Any, Any]:
        """Copies of the state and of the last transition's diagnostics (the next replay overwrites the buffers)."""
        state = dataclasses.replace(self.state, x=self.state.x.clone(), energy=self.state.energy.clone(),
                                    grad=self.state.grad.clone())
        info = dataclasses.replace(self.info, energy=self.info.energy.clone(), grad_norm=self.info.grad_norm.clone(),
                                   accepted=None if self.info.accepted is None else self.info.accepted.clone())
        return state, info


def capture(fn: Callable[[], T], generator: torch.Generator, device: torch.device | str,
            warmup: int = 2) -> tuple[torch.cuda.CUDAGraph, T]:
    """``fn()`` captured as a CUDA graph, and what the captured call returned (tensors the graph's replays overwrite).

    ``fn`` runs ``warmup`` times eagerly on a side stream first (cuDNN's choices, lazy initialisation), then once
    under capture, with ``generator`` registered with the graph. The generator is left as it was before: the
    warm-up's draws are undone, so the first replay draws what an eager ``fn()`` would have drawn next. Raises
    `RuntimeError` when the capture fails (``fn`` reads a value back to the host, for instance); the generator
    then goes on with a copy of its state, and the graphs kept for it are dropped (a replay of one would not advance
    the copy)."""
    saved = generator.get_state()
    try:
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(warmup):
                fn()
        torch.cuda.current_stream(device).wait_stream(side)
        generator.set_state(saved)
        graph = torch.cuda.CUDAGraph()
        graph.register_generator_state(generator)
        try:
            with torch.cuda.graph(graph):
                out = fn()
        except RuntimeError:
            # a capture that did not end leaves the registered state marked as capturing (every later draw from
            # it would fail)
            generator.graphsafe_set_state(generator.clone_state())
            _forget(generator)
            raise
    finally:
        generator.set_state(saved)
    return graph, out


def _forget(generator: torch.Generator) -> None:
    """Drop every kept graph that replays ``generator``."""
    for graphs in list(_cache.values()):
        for key in [k for k, graph in graphs.items() if graph.generator is generator]:
            del graphs[key]


def _key(energy: Any, state: Any, config: Any, generator: torch.Generator, labels: Any, step_fn: Callable) -> tuple:
    owner, view = _identity(energy)
    tensors = [*owner.parameters(), *owner.buffers()] if isinstance(owner, torch.nn.Module) else []
    label_key = tuple(sorted((k, tuple(torch.as_tensor(v).shape)) for k, v in labels.items())) if labels else ()
    return (step_fn, view, tuple(state.x.shape), state.x.dtype, str(state.x.device), config,
            id(generator), label_key, tuple(t.data_ptr() for t in tensors), torch.is_autocast_enabled("cuda"))


def _identity(energy: Any) -> tuple[Any, Any]:
    """The object a graph is kept with, and what tells apart views of it (a ladder's `AtLevel` gives its energy and
    its level; any other energy is itself)."""
    return energy.graph_identity() if hasattr(energy, "graph_identity") else (energy, None)


def _graph_for(step_fn: Callable, energy: Any, state: Any, config: Any, generator: torch.Generator,
               labels: Any) -> _Graph | None:
    owner, _ = _identity(energy)
    try:
        if owner in _failed:
            return None
        graphs = _cache.setdefault(owner, {})
    except TypeError:  # an energy that cannot be weakly referenced: capture for this chain only
        graphs = {}
    key = _key(energy, state, config, generator, labels, step_fn)
    try:
        graph = graphs.get(key)  # the key holds the generator's id: a graph replays only the generator it was made with
    except TypeError:  # settings that do not hash (a sampler's own config type): capture for this chain only
        graph, key, graphs = None, None, {}
    if graph is None:
        try:
            graph = _Graph(step_fn, energy, state, config, generator, labels)
        except RuntimeError as err:  # said once per kind of energy; the chain runs eagerly, with the same results
            try:
                _failed[owner] = True  # not tried again for this energy
            except TypeError:
                pass  # an energy that cannot be weakly referenced is tried again in its next chain
            kind = type(owner).__name__
            if kind not in _warned:
                _warned.add(kind)
                warnings.warn(f"CUDA graph capture failed for {kind} ({str(err).splitlines()[0]}); its chains run"
                              " without graphs", RuntimeWarning, stacklevel=4)
            return None
        if key is not None:
            if len(graphs) >= MAX_GRAPHS_PER_ENERGY:
                graphs.pop(next(iter(graphs)))
            graphs[key] = graph
    graph.load(state, labels)
    return graph


def replayer(step_fn: Callable, energy: Any, state: Any, config: Any, generator: torch.Generator, labels: Any,
             count: int) -> _Graph | None:
    """A graph of one transition ``step_fn(energy, state, config, generator, labels)`` loaded with ``state``, for a run
    of ``count`` of them: ``None`` where the run is too short or off a CUDA device, or the capture failed (the
    caller then runs the transitions eagerly, with the same results)."""
    if count < MIN_STEPS or not state.x.is_cuda:
        return None
    return _graph_for(step_fn, energy, state, config, generator, labels)
