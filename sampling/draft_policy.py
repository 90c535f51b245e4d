"""How much to draft each step: fixed, adaptive, with a floor, and paused when drafts do not pay."""
from dataclasses import dataclass


@dataclass
class DraftPolicy:
    """Decides the draft length of each step and learns from the outcome.

    * ``adaptive``: transformers' heuristic, +2 after a step whose drafts were all accepted,
      -1 otherwise (never below 1, never above ``max_gamma``).
    * ``min_draft``: a draft shorter than this is dropped and the step is a plain target step
      (llama.cpp's ``--draft-min``); the drafter may stop early (unknown context, ``p_min``).
    * ``pause_after`` / ``pause_steps``: after ``pause_after`` consecutive steps with no accepted
      draft, draft nothing for ``pause_steps`` steps. After a pause one more fruitless step is
      enough to pause again, for twice as long, until a draft is accepted; so a strategy whose
      drafts do not pay costs about what plain decoding costs. 0 disables.
    * ``min_gain``: cost-aware pausing. A drafting step pays when it emits more tokens than the
      verification pass costs in single-token passes (measure it with ``bench.py --verify-cost``;
      about 1.4 for 5 rows on a 2-core CPU, close to 1 on a GPU). When the running mean of tokens
      per drafting step (halved weight per step) falls below ``min_gain``, drafting pauses as
      above. 0 disables.
    * ``p_min``: for drafter models, stop drafting when the drafter's top probability falls
      below it (llama.cpp's ``--draft-p-min``).
    """

    adaptive: bool = False
    min_draft: int = 0
    pause_after: int = 0
    pause_steps: int = 8
    p_min: float = 0.0
    max_gamma: int = 64
    min_gain: float = 0.0

    def __post_init__(self):
        for name in ("min_draft", "pause_after", "pause_steps", "max_gamma"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if not isinstance(self.min_gain, (int, float)) or self.min_gain < 0:
            raise ValueError(f"min_gain must be >= 0, got {self.min_gain!r}")
        if not 0.0 <= self.p_min < 1.0:
            raise ValueError(f"p_min must be in [0, 1), got {self.p_min!r}")
        self.start(1)

    def start(self, gamma: int) -> None:
        """Reset the state for a new generation that drafts ``gamma`` tokens per step."""
        self.gamma = gamma
        self.zero_streak = 0
        self.paused = 0
        self.next_pause = self.pause_steps
        self.paused_steps = 0  # steps spent paused, for the statistics
        self.gain = None  # running mean of tokens emitted per drafting step

    def length(self) -> int:
        """Drafts to ask for in the coming step (0 while paused)."""
        if self.paused > 0:
            self.paused -= 1
            self.paused_steps += 1
            return 0
        return self.gamma

    def keep(self, drafted: int) -> int:
        """How many of ``drafted`` proposals to verify (0 when fewer than ``min_draft``)."""
        return drafted if drafted >= self.min_draft else 0

    def update(self, drafted: int, accepted: int) -> None:
        if drafted == 0:
            return
        if self.adaptive:
            self.gamma = min(self.gamma + 2, self.max_gamma) if accepted == drafted else max(1, self.gamma - 1)
        if self.min_gain:
            tokens = accepted + 1
            self.gain = tokens if self.gain is None else (self.gain + tokens) / 2
            if self.gain >= self.min_gain:
                self.next_pause = self.pause_steps
            else:
                self.paused, self.gain = self.next_pause, self.min_gain  # probe again after the pause
                self.next_pause = min(2 * self.next_pause, 64)
            return
        if accepted > 0:
            self.zero_streak, self.next_pause = 0, self.pause_steps
            return
        self.zero_streak += 1
        if self.pause_after and self.zero_streak >= self.pause_after:
            self.paused, self.zero_streak = self.next_pause, self.pause_after - 1
            self.next_pause *= 2
