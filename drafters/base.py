"""The ``Drafter`` base class: what the verification loops (``sampling.speculative_decoding``'s
chain loop, ``sampling.tree_decoding``'s tree loop) ask of a source of drafts, each optional
capability a method or attribute with a default here, so the loops never probe.

A drafter keeps no state between its calls within a step: what it asks of the target's
distributions (``fetch``) comes back to it whole (``accept`` / ``accept_tree``).
"""
from typing import Any, List, Optional, Tuple

import torch
from torch import Tensor

from runners.trees import tree_depths

UNLIMITED = 1 << 30
UNREAD = object()  # ``Drafter.fetch_logits``: not read from the logits (the loop makes the distributions and calls ``fetch``)


class Drafter:
    """A source of drafts. Override ``propose`` for chains, ``propose_tree`` (with
    ``supports_trees = True``) for trees, or both; everything else has a default.

    ``cheap``: drafting costs nothing next to a verification pass (n-grams, lookups); with
    ``DraftPolicy.auto`` such a drafter is asked to fill padded passes. ``memory_key``: what a
    ``DraftPolicy`` with ``remember`` knows it by across generations (None: nothing remembered).
    ``tree_probs``: ``propose_tree_with_probs`` is what the tree loop calls (drafts sampled from
    a distribution, verified by multi-step speculative sampling). ``step_cost``: a draft's cost
    relative to a one-position target pass, when the drafter was measured itself (a learned head);
    None: the policy's ``draft_cost`` (the drafter model's) for one that is not cheap.
    ``reports_evidence``: ``evidence`` tells what backs each draft of the last ``propose``; a cheap
    one is then asked for up to the step's bound and the policy cuts by that evidence.
    ``tree_evidence``: ``evidence`` tells, after ``propose_tree``, what backs each node; the tree loop
    then estimates nodes by it and gates a cheap one as the chain loop does (never paused, probed).
    """

    cheap: bool = True
    step_cost: Optional[float] = None
    memory_key: Any = None
    supports_trees: bool = False
    tree_probs: bool = False
    reports_evidence: bool = False
    tree_evidence: bool = False

    def attach(self, target: Any) -> None:
        """Before the first step: the target's runner (``runners.Runner``) this generation verifies
        with. A drafter that reads the target's hidden states sets ``target.hidden_layers`` here and
        reads ``target.hidden`` after each pass, in ``accept`` / ``accept_tree``."""

    def max_drafts(self, position: int) -> int:
        """How many drafts it can propose for a sequence of ``position`` tokens."""
        return UNLIMITED

    def propose(self, ids: Tensor, tokens: List[int], k: int) -> Tuple[int, Tensor | None]:
        """Write up to ``k`` drafts into ``ids[0, len(tokens):]``; return how many, and their
        probabilities ``q`` ``[count, V]`` under the drafter (None for a deterministic drafter)."""
        raise NotImplementedError(f"{type(self).__name__} drafts trees only")

    def propose_tree(self, tokens: List[int], budget: int) -> Tuple[List[int], List[int]]:
        """Up to ``budget`` node tokens and their parents (-1: the root, the last token; parents
        before children), most promising first: any prefix of the nodes must be a tree too."""
        raise NotImplementedError(f"{type(self).__name__} does not draft trees")

    def propose_tree_with_probs(self, tokens: List[int], budget: int) -> Tuple[List[int], List[int], Tensor]:
        """As ``propose_tree``, with ``q`` ``[1 + N, V]``: row 0 the distribution the root's children
        were drawn from, row ``1 + i`` node ``i``'s, each child drawn independently."""
        raise NotImplementedError(f"{type(self).__name__} has no tree probabilities")

    def tree_drafts(self, parents: List[int]) -> int:
        """For the last ``propose_tree`` (whose full proposal had ``parents``): the drafts it paid for, each a
        pass of a drafter that is not cheap, priced each as the chain loop's drafts are (``DraftPolicy.step_cost``,
        ``LiveCosts.per_draft``); by default one a level of the tree (a model drafting level by level)."""
        return max(tree_depths(parents)) + 1 if parents else 0

    def estimates(self) -> List[float] | None:
        """For the last ``propose_tree``: each node's estimated chance of being accepted (the product
        along its path), which the tree loop weighs against pass costs; None: the loop estimates
        from the sibling ranks it has seen accepted. Used for deterministic drafts only."""
        return None

    def evidence(self) -> List[int] | None:
        """For the last ``propose`` (or ``propose_tree``, with ``tree_evidence``: one per node): what
        backs each draft, an int that grows with the chance of its acceptance (a matched context's
        length), which the policy keys its acceptance by depth on; 0: nothing backs it (a random filler: a
        chain is verified up to the draft before it); None: nothing to tell (the policy uses depth alone).
        Deterministic drafts only."""
        return None

    def sources(self, nodes: List[int], path: List[int]) -> List[str]:
        """Which of its sources proposed each node of the accepted ``path`` (one name per node), for
        the statistics' per-source counts; [] when it has no sources to tell apart."""
        return []

    def fetch(self, target_probs: Tensor) -> Any:
        """What it needs on the host from the target's distributions (``[k + 1, V]``, or ``[1 + N, V]``
        for a tree): a tensor, None, or a list of these, fetched in the step's single device sync."""
        return None

    def fetch_logits(self, logits: Tensor, temperature: float) -> Any:
        """``fetch(softmax(logits / temperature))``'s value read from the logits ``[k + 1, V]`` alone, where that is sure
        to be the same (a greedy loop then makes no distribution); ``UNREAD`` where it is not (the loop makes them)."""
        return UNREAD

    @property
    def fetches(self) -> bool:
        """Whether ``fetch`` reads the target's distributions (it is overridden): else a greedy loop makes none,
        its tokens chosen from the logits (``GreedyProcessor.choose``), as target AR's are."""
        return type(self).fetch is not Drafter.fetch

    def accept(self, tokens: List[int], start: int, n_accepted: int, fetched: Any) -> None:
        """After a chain step: ``tokens[start:]`` were emitted, the first ``n_accepted`` of them
        accepted drafts; ``fetched`` is what ``fetch`` returned, each tensor as nested lists."""

    def accept_tree(self, tokens: List[int], start: int, nodes: List[int], parents: List[int], path: List[int], fetched: Any) -> None:
        """After a tree step: ``tokens[start:]`` were emitted, the branch ``path`` (node indices, root
        to leaf) accepted, then the target's own token; ``fetched`` as ``fetch`` returned it."""

    def finish(self, output: List[int] | None) -> None:
        """After the generation (``sampling.generate``): its new tokens, or None when it failed."""


def write_drafts(ids: Tensor, at: int, drafts: List[int]) -> int:
    """Put ``drafts`` into ``ids[0, at:]``; returns how many. On CPU through numpy's view of ``ids`` (a list written
    into memory, no tensor made: a fifth of the torch path's host time, asked every step of a gated drafter)."""
    if drafts:
        if ids.device.type == "cpu":
            ids.numpy()[0, at : at + len(drafts)] = drafts
        else:
            ids[0, at : at + len(drafts)] = torch.tensor(drafts, dtype=torch.long)
    return len(drafts)


class Structural(Drafter):
    """A drafter written against the earlier structural protocol (no base class, optional methods
    probed): its methods, and this base's defaults for what it lacks. The one place that probes."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.cheap = inner.cheap
        self.memory_key = getattr(inner, "memory_key", None)
        self.tree_probs = hasattr(inner, "propose_tree_with_probs")
        self.supports_trees = self.tree_probs or hasattr(inner, "propose_tree")
        self.reports_evidence = bool(getattr(inner, "reports_evidence", False))
        self.tree_evidence = bool(getattr(inner, "tree_evidence", False))

    def _call(self, name: str, *args):
        method = getattr(self.inner, name, None)
        return method(*args) if method is not None else getattr(Drafter, name)(self, *args)

    def attach(self, target):
        return self._call("attach", target)

    def max_drafts(self, position):
        return self._call("max_drafts", position)

    def propose(self, ids, tokens, k):
        return self._call("propose", ids, tokens, k)

    def propose_tree(self, tokens, budget):
        return self._call("propose_tree", tokens, budget)

    def propose_tree_with_probs(self, tokens, budget):
        return self._call("propose_tree_with_probs", tokens, budget)

    def estimates(self):
        return self._call("estimates")

    def tree_drafts(self, parents):
        return self._call("tree_drafts", parents)

    def evidence(self):
        return self._call("evidence")

    def sources(self, nodes, path):
        return self._call("sources", nodes, path)

    def fetch(self, target_probs):
        return self._call("fetch", target_probs)

    def accept(self, tokens, start, n_accepted, fetched):
        return self._call("accept", tokens, start, n_accepted, fetched)

    def accept_tree(self, tokens, start, nodes, parents, path, fetched):
        return self._call("accept_tree", tokens, start, nodes, parents, path, fetched)

    def finish(self, output):
        return self._call("finish", output)


def as_drafter(drafter: Any) -> Drafter:
    """``drafter`` itself when it derives from ``Drafter``, else wrapped as ``Structural``."""
    return drafter if isinstance(drafter, Drafter) else Structural(drafter)
