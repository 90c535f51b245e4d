"""Beam search's loop over a ``runners.BeamRunner``: the reference's rule (GNMT length penalty,
``top_k`` extensions per unfinished beam, finished beams competing with their score)."""
from dataclasses import dataclass
from typing import FrozenSet, List, Sequence, Tuple

import torch
from torch import Tensor

from runners import BeamRunner

Beam = Tuple[float, float, List[int], bool]  # (penalised score, sum of log-probabilities, new tokens, finished)


@dataclass(frozen=True)
class BeamSearch:
    num_beams: int
    top_k: int
    alpha: float
    min_length: float
    stop_tokens: FrozenSet[int]

    def penalty(self, length: int) -> float:
        """The GNMT length penalty ``((min_length + length) / (min_length + 1)) ** alpha``."""
        return ((self.min_length + length) / (self.min_length + 1)) ** self.alpha

    def run(self, prompt: List[int], runner: BeamRunner, end: int, observers: Sequence = ()) -> List[int]:
        """The best beam's new tokens, generated up to position ``end``; observers see the kept beams each step."""
        logits = runner.start(prompt)
        beams: List[Beam] = [(0.0, 0.0, [], False)]
        for step in range(1, end - len(prompt) + 1):
            beams, parents = self.step(beams, logits, step)
            for observer in observers:
                observer.on_beams([(b[0], prompt + b[2]) for b in beams], len(prompt) + step)
            alive = [b for b in beams if not b[3]]
            if not alive or step == end - len(prompt):
                break
            logits = runner.extend(parents, [b[2][-1] for b in alive])
        return beams[0][2]

    def step(self, beams: List[Beam], logits: Tensor, step: int) -> Tuple[List[Beam], List[int]]:
        """The kept beams after one step (``logits`` ``[B, V]``: a row per unfinished beam) and, for each
        kept unfinished beam, the row it extends. The first step starts ``num_beams`` beams from the
        most probable first tokens; later ones extend each unfinished beam by its ``top_k`` best.
        Ties keep the reference's order: beam by beam, finished beams in their place."""
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        width = self.num_beams if step == 1 else self.top_k
        values, indices = torch.topk(logprobs, min(width, logprobs.size(-1)), dim=-1)
        values, indices = values.tolist(), indices.tolist()
        penalty = self.penalty(step)
        candidates, row = [], 0
        for beam in beams:
            if beam[3]:  # finished beams stay in the running with their score
                candidates.append((beam, None))
                continue
            _, total, tokens, _ = beam
            for logprob, token in zip(values[row], indices[row]):
                candidates.append((((total + logprob) / penalty, total + logprob, tokens + [token], token in self.stop_tokens), row))
            row += 1
        candidates.sort(key=lambda c: c[0][0], reverse=True)
        kept = candidates[: self.num_beams]
        return [beam for beam, _ in kept], [parent for beam, parent in kept if not beam[3]]
