"""What dynamo makes of one of our compiled passes (``runners.compiled``): its graphs, the graph
breaks and their reasons, its operations and the guards checked before every call. A diagnosis of
the host time a compiled step costs (docs/gpu.md: ours grows with the layers), read on any device:
``torch._dynamo.explain`` traces the pass as ``CompiledRunner`` runs it (the same function, input
buffers, static cache and attention), with a backend that builds no kernels.

``torch._dynamo.explain`` resets dynamo before and after, so every compiled graph of the process
is forgotten (rebuilt at its next call): run it in a process of its own
(``scripts/host_overhead.py --explain``).
"""
import contextlib
from dataclasses import dataclass
from typing import List, Tuple

import torch
import torch._dynamo
from torch.nn import Module

from runners.attention import shared_kv_heads
import runners.compiled as compiled  # its BUCKETS as they are when called
from runners.static import set_length


@dataclass(frozen=True)
class PassExplained:
    """One compiled pass as dynamo sees it. ``reasons``: each graph break's reason and where it
    happened (the user frame nearest to the break); ``guards``: what dynamo checks before every call
    (a count that grows with the layers is host time that grows with them), ``cache_guards`` the
    part of them whose source is the static cache."""

    rows: int  # the pass's bucket (positions fed)
    layers: int  # the model's decoder layers
    graphs: int
    breaks: int
    reasons: Tuple[str, ...]
    ops: int
    guards: int
    cache_guards: int

    def lines(self) -> List[str]:
        """The report, one fact a line."""
        head = (f"compiled pass over {self.rows} position(s), {self.layers} layers: {self.graphs} graph(s), "
                f"{self.breaks} graph break(s), {self.ops} ops, {self.guards} guards ({self.cache_guards} on the cache's tensors)")
        return [head] + [f"  break {i + 1}: {reason}" for i, reason in enumerate(self.reasons)]


def _reason(reason) -> str:
    """A graph break's reason, one line, with the innermost user frame."""
    text = " ".join(str(reason.reason).split())
    stack = getattr(reason, "user_stack", None) or []
    return f"{text} ({stack[-1].filename}:{stack[-1].lineno})" if stack else text


@torch.no_grad()
def explain_pass(model: Module, rows: int = 1, hidden_layers: Tuple[int, ...] = ()) -> PassExplained:
    """``torch._dynamo.explain`` of ``model``'s compiled pass over ``rows`` new positions (its bucket,
    at most ``runners.compiled.BUCKETS[-1]``), from position 0 of a cache of the pool; with ``hidden_layers``, the pass
    that also returns those hidden states (a learned head's). The cache is given back empty."""
    size = compiled.bucket(rows)
    if size is None:
        raise ValueError(f"a compiled pass feeds at most {compiled.BUCKETS[-1]} positions, got {rows}")
    runner = compiled.CompiledRunner(model)
    runner._reserve(size)
    state, cache = runner.state, runner.cache
    ids, positions = state.ids[size], state.positions[size]
    positions.copy_(state.steps[:, :size])
    attention = contextlib.nullcontext() if state.cuda else shared_kv_heads(model)
    with attention:
        if hidden_layers:
            out = torch._dynamo.explain(state._forward_hidden)(ids, positions, cache, tuple(hidden_layers))
        else:
            out = torch._dynamo.explain(state._forward)(ids, positions, cache)
    set_length(cache, 0)
    guards = out.out_guards or []
    return PassExplained(
        rows=size, layers=len(cache.layers), graphs=out.graph_count, breaks=out.graph_break_count,
        reasons=tuple(_reason(r) for r in out.break_reasons), ops=out.op_count, guards=len(guards),
        cache_guards=sum("cache" in str(getattr(g, "name", "")) for g in guards))
