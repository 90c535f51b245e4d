"""Per-generation statistics, filled by the generation functions when a caller passes one in."""
from dataclasses import dataclass, field


@dataclass
class GenerationStats:
    """What a generation did, step by step.

    A *step* is one target forward pass (verification, or a plain target step); it emits the
    accepted drafts plus one token of the target's own (the bonus or the correction).
    """

    generated: int = 0  # new tokens returned
    target_forward_passes: int = 0
    drafted: int = 0
    accepted: int = 0
    drafted_at: list[int] = field(default_factory=list)  # drafts proposed at draft position i
    accepted_at: list[int] = field(default_factory=list)  # drafts accepted at draft position i
    # host clock; verification ends with the step's one device sync, so on CUDA drafter kernels
    # still queued when drafting returns are counted in verify_seconds
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    # the first step's seconds (drafting and verifying), in the two above too: the prompt's pass, which no drafter
    # shortens (on a 700-token prompt nearly half of target AR's 64 tokens): a run's time less it is its decoding's
    first_step_seconds: float = 0.0
    paused_steps: int = 0  # steps a DraftPolicy drafted nothing because drafts were not paying
    emitted_by_step: list[int] = field(default_factory=list)  # tokens each step emitted (Spec-Bench's accept_lengths)
    drafted_by_step: list[int] = field(default_factory=list)  # drafts each step verified
    peer_settings: dict = field(default_factory=dict)  # a transformers peer: its candidate generator's settings in force
    accepted_by: dict = field(default_factory=dict)  # a merged drafter: accepted drafts by the source that proposed them
    policy: str = ""  # what the draft policy chose and from what measurement (``DraftPolicy.chosen``)

    def credit(self, sources: list) -> None:
        """Count accepted drafts by source (one name per accepted draft; ``accepted_by`` sums to ``accepted``)."""
        for source in sources:
            self.accepted_by[source] = self.accepted_by.get(source, 0) + 1

    def record_step(self, drafted: int, accepted: int, emitted: int) -> None:
        self.target_forward_passes += 1
        self.drafted += drafted
        self.accepted += accepted
        self.generated += emitted
        self.emitted_by_step.append(emitted)
        self.drafted_by_step.append(drafted)
        grow = drafted - len(self.drafted_at)
        if grow > 0:
            self.drafted_at.extend([0] * grow)
            self.accepted_at.extend([0] * grow)
        for i in range(drafted):
            self.drafted_at[i] += 1
        for i in range(accepted):
            self.accepted_at[i] += 1

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts / drafted tokens (0.0 when nothing was drafted): the reference's float."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_tokens(self) -> float:
        """Tokens emitted per target forward pass, the bonus token included (1.0 = no gain)."""
        return self.generated / self.target_forward_passes if self.target_forward_passes else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        """Acceptance rate of the i-th draft of a step, given that it was proposed."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at)]

    def as_dict(self) -> dict:
        return {
            "generated": self.generated,
            "target_forward_passes": self.target_forward_passes,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted_tokens": self.mean_accepted_tokens,
            "per_position_acceptance": self.per_position_acceptance,
            "draft_seconds": self.draft_seconds,
            "verify_seconds": self.verify_seconds,
            "first_step_seconds": self.first_step_seconds,
            "paused_steps": self.paused_steps,
            "accepted_by": dict(self.accepted_by),
            "policy": self.policy,
        }
