"""Replay NASD on a record of ``scripts/nasd_record.py`` without the model: the real loop
(``sampling.draft_and_verify``), drafter and policy, against a runner that answers each position with the
recorded target's token and its recorded top-k (exact for every value the loop keeps: a position's logits
are kept only when every draft before it was accepted, so its context is target AR's). Counts, no clock:
the policy weighs the recorded start-up costs (not measured in the loop).

    .venv/bin/python scripts/nasd_replay.py /tmp/nasd.json
"""
import argparse
import json
import sys
from pathlib import Path
from collections import Counter
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


from app.repl.repl import NGRAM_N  # noqa: E402
from drafters.ngram import NGramSpec  # noqa: E402
from drafters.spec import DraftContext  # noqa: E402
from ngram_assisted import NGramStorage  # noqa: E402
from sampling import DraftPolicy, GenerationStats, generate  # noqa: E402
from sampling.config import Observer, Step  # noqa: E402
from utils.replayed_runner import ReplayedRunner  # noqa: E402
from scripts.grounded_counts import copy_oracle  # noqa: E402

VOCAB = 151936  # Qwen2.5's output rows


class Steps(Observer):
    def __init__(self) -> None:
        self.steps: List[tuple] = []

    def on_step(self, step: Step) -> None:
        self.steps.append((step.start - step.prompt_length, len(step.proposed), step.accepted, step.rows))


def replay(entry: dict, costs, storage=None, gamma: int = 4, first_target: bool = True, filler_top_k: int = 3,
           policy: bool = True, **options) -> List[tuple]:
    """NASD's steps on one recorded prompt, as ``(offset, drafts, accepted, rows)``: the REPL's row (a fresh
    basic n 3 storage unless ``storage``, stopping at an unknown context) under the calibrated policy on
    ``costs`` (``options``: ``DraftPolicy``'s ``auto``, ``gate``...), or none (``policy`` false: ``gamma`` drafts)."""
    prompt, ref = entry["prompt"], entry["ref"]
    fillers = {int(k): v[:filler_top_k] for k, v in entry["fillers"].items()}
    seen = Steps()
    made = DraftPolicy(**{"min_gain": 1.0, "row_costs": tuple(costs), "live": False, **options}) if policy else DraftPolicy()
    values = dict(gamma=gamma, max_gen_len=len(ref), eos_tokens_id=[VOCAB - 1], first_target=first_target, policy=made,
                  stats=GenerationStats(), streamer=seen)
    storage = storage if storage is not None else NGramStorage(3, VOCAB)
    out, _ = generate(prompt, ReplayedRunner(prompt, ref, VOCAB, fillers), NGramSpec(filler_top_k, stop_if_unknown=True), values,
                      DraftContext(storage=storage))
    assert out == ref, "the replay left target AR's tokens"
    return seen.steps


def copy_run(prompt: List[int], ref: List[int], offset: int) -> int:
    """The longest run of ``ref[offset:]`` that continues an earlier occurrence of the last token (the copy oracle's draft)."""
    seq, best = prompt + ref[:offset], 0
    for start in (i for i in range(len(seq) - 1) if seq[i] == seq[-1]):
        run = 0
        while offset + run < len(ref) - 1 and start + 1 + run < len(seq) and seq[start + 1 + run] == ref[offset + run]:
            run += 1
        best = max(best, run)
    return best


def losses(entry: dict, steps: List[tuple]) -> Counter:
    """Where a step fell short of the copy oracle's draft there: drafted nothing, its first draft wrong, a
    later draft wrong, or its drafts all accepted but fewer than the oracle's."""
    out: Counter = Counter()
    for offset, drafted, accepted, _ in steps:
        copy = copy_run(entry["prompt"], entry["ref"], offset)
        if copy == 0 or accepted >= copy:
            continue
        out["empty" if drafted == 0 else "first wrong" if accepted == 0 else "cut" if accepted == drafted else "later wrong"] += 1
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("record")
    args = p.parse_args()
    record = json.load(open(args.record))
    costs = record["row_costs"]

    def cost(rows: int) -> float:
        return costs[rows - 1] if rows <= len(costs) else costs[-1] + (costs[-1] - costs[0]) / (len(costs) - 1) * (rows - len(costs))

    variants = {"n 3, gamma 4": (3, {}), f"n {NGRAM_N}, gamma 4": (NGRAM_N, {}), f"n {NGRAM_N}, gamma auto (REPL)": (NGRAM_N, {"auto": True}),
                f"n {NGRAM_N}, gamma 16, no policy": (NGRAM_N, {"gamma": 16, "policy": False})}
    print(f"{record['dtype']}, start-up costs by positions: {' '.join(f'{c:.2f}' for c in costs)}")
    for entry in record["prompts"]:
        print(f"{entry['question_id']}: copy oracle {copy_oracle(entry['prompt'], entry['ref'])} passes, the REPL's run "
              f"(recorded, costs in the loop, n 3) {len(entry['steps'])}")
        for name, (n, options) in variants.items():
            steps = replay(entry, costs, NGramStorage(n, VOCAB), **options)
            units = sum(cost(rows) for *_, rows in steps)
            print(f"  {name:26s} passes {len(steps):3d}, tokens per unit of cost {len(entry['ref']) / units:.2f}, "
                  f"short of the oracle: {dict(losses(entry, steps))}")


if __name__ == "__main__":
    main()
