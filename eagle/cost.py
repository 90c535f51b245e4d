"""What a draft step of a learned head costs next to a target pass, measured on this machine: the
draft policy's per-draft cost for the head (``Drafter.step_cost``), said in the REPL's Head line."""
import time

import torch
from torch.nn import Module

from eagle.head import Eagle3Head, HeadCache
from eagle.head_step import HeadStepCache
from measure.timing import PassTimer, samples
from runners import EAGER, RunnerConfig, synchronize


class HeadTimer:
    """The head with ``context`` positions in its cache; times ``rows`` more (1: a chain's draft
    step, its draft-vocabulary logits included; more: a tree depth)."""

    def __init__(self, head: Eagle3Head, context: int, compiled: bool = False):
        weight = head.fc.weight
        self.head, self.context = head, context
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(head.config.target_vocab_size, (1, context + 8), generator=generator).to(weight.device)
        self.hidden = torch.randn(context + 8, head.config.hidden_size, generator=generator).to(weight)
        if compiled:  # the head's compiled step (``eagle.head_step``), as it drafts for a target on the compiled step
            holder = HeadStepCache(head, context + 16)
            self.cache, self.step = holder, lambda cache, *a, **k: holder.draft_step(*a, **k)
        else:
            self.cache, self.step = HeadCache(head, context + 16, weight.device, weight.dtype), head.draft_step
        self.step(self.cache, self.ids[0, :context], 0, hidden=self.hidden[:context])

    def seconds(self, rows: int) -> float:
        """Seconds of one draft step over ``rows`` positions after the context, every row's logits
        (``Eagle3Head.draft_step``: the C head step where it runs), written over by the next."""
        head, end = self.head, self.context + rows
        synchronize(head)
        start = time.perf_counter()
        self.step(self.cache, self.ids[0, self.context : end], self.context, hidden=self.hidden[self.context : end], n_last=rows)
        synchronize(head)
        return time.perf_counter() - start


@torch.no_grad()
def measure_step_cost(head: Eagle3Head, target: Module, context: int = 128, repeats: int = 7,
                      runner: RunnerConfig = EAGER) -> float:
    """A head step over one position relative to a one-position target pass after ``context``
    positions (each one's least sample of ``repeats`` interleaved rounds after a warm-up each): ~1 s on the embedded
    model. Least samples, not medians: another process only adds time to a sample, and more to the target's pass on
    every thread than to the head's step (on the loaded 2-core Zen 4, medians priced the head at 2.0-2.5% of a pass
    against 9.9% alone, so the policy drafted as if the head were nearly free; 2026-12-01)."""
    compiled = runner.step_for(target)  # the target on the compiled step: the head drafts on its own
    return least_ratio(*samples([(HeadTimer(head, context, compiled), 1), (PassTimer(target, context, 1, runner=runner), 1)], repeats))


def least_ratio(head_seconds: list, target_seconds: list) -> float:
    """The head step's least sample over the target pass's, to 4 places (``measure_step_cost``)."""
    return round(min(head_seconds) / min(target_seconds), 4)
