"""A clock of forward passes (``bench.py --overhead``), kept at the ``Runner`` interface: while
``timing_passes(clock)`` is in force, every runner ``make_runner`` hands out is a ``TimedRunner``, whose
``__call__`` and ``tree_pass`` run on ``clock`` and whose everything else is the runner's own. It reads
nothing inside a runner (the lean forward, a compiled graph, llama.cpp, a kernel yet to come are alike).
transformers' own ``generate`` (the peers' rows) makes no runner: ``model_passes`` times its model's
top-level calls on the same clock; passes nest, so a pass seen twice (``KVCacheModel`` calls its model)
counts once."""
import contextlib
import time
from contextvars import ContextVar
from typing import Callable, Iterator, List, Optional, Sequence

from torch.nn import Module


class PassClock:
    """Time inside forward passes and their number, read on ``clock``; ``sync`` (e.g. a device
    synchronisation) runs at each outermost pass's two ends, so that the time is the pass's work."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter, sync: Optional[Callable[[], None]] = None):
        self.clock, self.sync = clock, sync
        self.seconds, self.passes, self.depth, self.started = 0.0, 0, 0, 0.0

    def enter(self) -> int:
        """A pass starts; returns the depth it starts at (for ``leave``)."""
        depth = self.depth
        if depth == 0:
            if self.sync is not None:
                self.sync()
            self.started = self.clock()
        self.depth = depth + 1
        return depth

    def leave(self, depth: int) -> None:
        """The pass started at ``depth`` ends (also after an exception: the depth is set back)."""
        self.depth = depth
        if depth == 0:
            if self.sync is not None:
                self.sync()
            self.seconds += self.clock() - self.started
            self.passes += 1

    @contextlib.contextmanager
    def one_pass(self) -> Iterator[None]:
        depth = self.enter()
        try:
            yield
        finally:
            self.leave(depth)


_CLOCK: ContextVar[Optional[PassClock]] = ContextVar("pass_clock", default=None)


@contextlib.contextmanager
def timing_passes(clock: PassClock) -> Iterator[PassClock]:
    """Runners made inside (``make_runner``) time their passes on ``clock``."""
    token = _CLOCK.set(clock)
    try:
        yield clock
    finally:
        _CLOCK.reset(token)


class TimedRunner:
    """A ``runners.Runner`` whose passes (``__call__``, ``tree_pass``) are timed on a ``PassClock``;
    every other attribute, read or set, is the wrapped runner's."""

    def __init__(self, runner, clock: PassClock):
        object.__setattr__(self, "_runner", runner)
        object.__setattr__(self, "_clock", clock)

    def __call__(self, ids, n_last: int = 1):
        with self._clock.one_pass():
            return self._runner(ids, n_last)

    def tree_pass(self, ids, cur: int, nodes: List[int], parents: List[int]):
        with self._clock.one_pass():
            return self._runner.tree_pass(ids, cur, nodes, parents)

    def __getattr__(self, name: str):
        return getattr(self._runner, name)

    def __setattr__(self, name: str, value) -> None:
        setattr(self._runner, name, value)


def timed_runner(runner):
    """``runner`` timed on the clock in force (``timing_passes``), or ``runner`` itself without one."""
    clock = _CLOCK.get()
    return runner if clock is None else TimedRunner(runner, clock)


@contextlib.contextmanager
def model_passes(models: Sequence[Module], clock: PassClock) -> Iterator[None]:
    """The top-level calls of ``models`` timed on ``clock``: the passes of transformers' own ``generate``,
    which makes no runner (inside a runner's pass they nest, and count once). Its hooks are
    ``runners.hooks.skippable``: the runners' fast paths still run (and are timed at the runner)."""
    from runners.hooks import skippable  # no hook of the user's: the fast paths run on under it

    depths: List[int] = []
    enter, leave = skippable(lambda *a: depths.append(clock.enter())), skippable(lambda *a: clock.leave(depths.pop()))
    handles = [h for m in models for h in (m.register_forward_pre_hook(enter), m.register_forward_hook(leave))]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
