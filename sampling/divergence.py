"""Why a greedy strategy left target autoregressive: a rounding near-tie or a real disagreement.

At the first position where a strategy's tokens differ from target AR's, the target's logits for
the common prefix are computed twice, with the same weights and the same kind of runner:

* (a) as target AR computed them: the prompt in one pass, then one position per pass;
* (b) as the strategy computed them: the very calls its loop made to the target (pass lengths,
  fed drafts, rollbacks), replayed from the steps a ``PassRecorder`` saw.

Rule, with ``a`` AR's token, ``b`` the strategy's, ``margin = logit(a) - logit(b)`` in each
computation and ``rounding`` the largest |logit difference| between the two computations over the
whole row at that position: the divergence is a **near-tie** when the two computations order
``a`` and ``b`` differently (as the greedy loop orders them: by probability, the lower token id
first on a tie) and both |margins| <= ``rounding``. Otherwise it is a **disagreement**: the
strategy emitted a token that the target did not choose in the very pass that verified it, a bug.

Everything here runs after the generation, on its record: no generated token depends on it.
"""
from dataclasses import asdict, dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.nn import Module

from runners.config import RunnerConfig
from sampling.config import Observer, Step

NEAR_TIE, DISAGREEMENT = "near-tie", "disagreement"

# one call of the loop to the target: (first predicted position, positions scored, drafts fed, accepted)
Pass = Tuple[int, int, Sequence[int], int]


def default_runner(model: Module, config: Optional[RunnerConfig] = None):
    """The runner the loops use with the cache on, under ``config`` (None: eager, the device's
    cache): its cache kind and compilation (``runners.make_runner``); the model's own kernels."""
    from runners import EAGER, make_runner

    return make_runner(model, True, config=config or EAGER)


class _OnKernels:
    """A runner whose passes run on given kernels (``runners.kernels``' value: the prepacked or the
    model's own linear layers, or a plan by pass width)."""

    def __init__(self, runner, model: Module, prepack):
        self.runner, self.model, self.prepack = runner, model, prepack
        self.cache_kind, self.device = getattr(runner, "cache_kind", "?"), getattr(runner, "device", "cpu")

    def __call__(self, ids: Tensor, n_last: int = 1) -> Tensor:
        from runners import kernels

        with kernels(self.model, self.prepack):
            return self.runner(ids, n_last)

    def rollback(self, length: int) -> None:
        self.runner.rollback(length)


def on_kernels(runner_factory: Callable[[Module], object], option: str) -> Callable[[Module], object]:
    """``runner_factory`` whose runners pass on the kernels ``option`` ("prepacked", "own", a plan by
    width as ``measure.kernels.plan_label`` names it; "" or "llama.cpp": as the runner is), for
    replaying a run that had other kernels than the model has now."""
    if not option or option == "llama.cpp":
        return runner_factory
    from measure.kernels import label_plan

    plan = label_plan(option)
    return lambda model: _OnKernels(runner_factory(model), model, plan)


class PassRecorder(Observer):
    """Records the target passes of one generation, for ``classify_divergence``: one tuple per step."""

    def __init__(self):
        self.passes: List[Pass] = []

    def on_step(self, step: Step) -> None:
        self.passes.append((step.start, step.rows, step.proposed, step.accepted))


@dataclass(frozen=True)
class Divergence:
    """A classified greedy divergence. Logits are the target's raw logits, as Python floats."""

    position: int  # index of the first differing token among the new tokens (0: the first new token)
    ar_token: int | None  # None: that output ended there (a length difference: a disagreement)
    strategy_token: int | None
    ar_logits: Tuple[float, float] | None  # (logit of ar_token, of strategy_token) in AR's one-position passes
    pass_logits: Tuple[float, float] | None  # the same two in the strategy's pass
    ar_margin: float | None  # ar_logits[0] - ar_logits[1]
    pass_margin: float | None  # pass_logits[0] - pass_logits[1]
    rounding: float | None  # max |logit difference| between the two computations over the row
    rows: int  # positions scored by the strategy's pass that emitted the token
    cache: str  # the runner's cache kind
    verdict: str  # NEAR_TIE or DISAGREEMENT

    @property
    def margin(self) -> float | None:
        """The larger |margin| of the two computations."""
        return None if self.ar_margin is None else max(abs(self.ar_margin), abs(self.pass_margin))

    def line(self) -> str:
        """One line: "diverged at token 37: near-tie, margin 0.004 vs rounding 0.006"."""
        if self.margin is None:
            return f"diverged at token {self.position}: {self.verdict}, one output ends there"
        return f"diverged at token {self.position}: {self.verdict}, margin {self.margin:.3g} vs rounding {self.rounding:.3g}"

    def record(self) -> dict:
        """As JSON fields (runs.jsonl)."""
        return {**asdict(self), "margin": self.margin}


def _prefers_first(probs: Tensor, first: int, second: int) -> bool:
    """Whether greedy argmax over ``probs`` would rank ``first`` above ``second`` (ties: the lower id)."""
    p, q = float(probs[first]), float(probs[second])
    return p > q or (p == q and first < second)


def verdict(ar_row: Tensor, pass_row: Tensor, ar_token: int, strategy_token: int) -> Tuple[str, float, float, float]:
    """The module's rule on two logit rows ``[V]`` of the same position: (verdict, AR margin, pass
    margin, rounding), margins as ``logit(ar_token) - logit(strategy_token)``."""
    ar_row, pass_row = ar_row.double(), pass_row.double()
    ar_margin = float(ar_row[ar_token] - ar_row[strategy_token])
    pass_margin = float(pass_row[ar_token] - pass_row[strategy_token])
    rounding = float((ar_row - pass_row).abs().max())
    # the loop ranks float32 probabilities (GreedyProcessor); the order is decided as it decides it
    ar_order = _prefers_first(torch.softmax(ar_row.float(), -1), ar_token, strategy_token)
    pass_order = _prefers_first(torch.softmax(pass_row.float(), -1), ar_token, strategy_token)
    near = ar_order != pass_order and abs(ar_margin) <= rounding and abs(pass_margin) <= rounding
    return (NEAR_TIE if near else DISAGREEMENT), ar_margin, pass_margin, rounding


@torch.no_grad()
def replay(runner, tokens: List[int], passes: Sequence[Pass], position: int) -> Tuple[Tensor, int]:
    """The target's logits ``[V]`` predicting absolute ``position``, computed by calling ``runner``
    as the loop did: each recorded pass up to the one that emitted ``position``, fed ``tokens``
    (prompt + common prefix) then that step's drafts, padded to its length, and rolled back to
    what it accepted. Padding is never attended to by earlier positions; only its length counts.
    Returns (logits, that pass's rows)."""
    device = getattr(runner, "device", "cpu")
    for start, rows, drafts, accepted in passes:
        fed = tokens[:start] + list(drafts)
        fed += [0] * (start + rows - 1 - len(fed))
        logits = runner(torch.tensor([fed], dtype=torch.long, device=device), rows)
        if position <= start + accepted:
            return logits[position - start].float().cpu(), rows
        runner.rollback(start + accepted)
    raise ValueError(f"no recorded pass emitted position {position}")


def classify_divergence(
    model: Module, prompt: List[int], ar_tokens: List[int], strategy_tokens: List[int], passes: Sequence[Pass],
    runner_factory: Callable[[Module], object] = default_runner, pass_runner_factory: Callable[[Module], object] | None = None,
) -> Divergence | None:
    """Classify the first difference between target AR's new tokens and a greedy strategy's
    (None when they are equal). ``passes``: the strategy's target passes (``PassRecorder.passes``).
    ``runner_factory`` makes a fresh runner for each computation (default: the loops' own, ``default_runner``);
    any runner with the loop's interface (``runner(ids, n_last)``, ``rollback``, ``cache_kind``) fits.
    ``pass_runner_factory`` (default: ``runner_factory``) makes the strategy's runner where it ran
    other kernels than target AR (a benchmark row on prepacked linears against AR on the model's own):
    then the rounding compared is the one between the two computations as they really ran."""
    if getattr(model.config, "is_encoder_decoder", False):
        raise ValueError("classify_divergence replays decoder-only models only")
    j = next((i for i, (x, y) in enumerate(zip(ar_tokens, strategy_tokens)) if x != y), None)
    if j is None:
        if len(ar_tokens) == len(strategy_tokens):
            return None
        j = min(len(ar_tokens), len(strategy_tokens))
    position = len(prompt) + j
    common = list(prompt) + list(ar_tokens[:j])
    runner = runner_factory(model)
    cache = str(getattr(runner, "cache_kind", "?"))
    if j >= len(ar_tokens) or j >= len(strategy_tokens):  # one output stops early: no pair of tokens to weigh
        token = lambda ts: ts[j] if j < len(ts) else None  # noqa: E731
        return Divergence(j, token(ar_tokens), token(strategy_tokens), None, None, None, None, None, 0, cache, DISAGREEMENT)
    one_position = [(start, 1, (), 0) for start in range(len(prompt), position + 1)]
    ar_row, _ = replay(runner, common, one_position, position)
    del runner  # a pooled cache (the compiled step's) goes back before the next runner takes one: the same graphs
    pass_row, rows = replay((pass_runner_factory or runner_factory)(model), common, passes, position)
    a, b = ar_tokens[j], strategy_tokens[j]
    kind, ar_margin, pass_margin, rounding = verdict(ar_row, pass_row, a, b)
    return Divergence(j, a, b, (float(ar_row[a]), float(ar_row[b])), (float(pass_row[a]), float(pass_row[b])),
                      ar_margin, pass_margin, rounding, rows, cache, kind)
