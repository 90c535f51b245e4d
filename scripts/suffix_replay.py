"""Replay greedy outputs through our suffix drafter and the authors' (arctic-inference, when importable),
offline: no target pass but the one that records each output. Per category, the tokens a greedy step
would emit (accepted drafts + 1), the drafts a step proposes and their acceptance, in path mode (each
prompt alone) and with the global memory over the repeated-task prompts in file order.

    python scripts/suffix_replay.py [--max-new-tokens 96] [--outputs FILE.json]

The outputs are recorded once with the embedded model (target AR, greedy) into ``--outputs``
(default: a file in the measurements cache) and read back on later runs.
"""
import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Callable, Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from drafters.suffix import SuffixDrafter, SuffixSettings  # noqa: E402
from drafters.suffix_memory import SuffixMemory  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [str(ROOT / "bench_prompts.jsonl"), str(ROOT / "prompts" / "code_editing.jsonl")]


def record(path: Path, length: int) -> List[dict]:
    """Greedy outputs of the embedded model for the first turn of every shipped prompt."""
    from app.bench.prompts import load_prompts
    from app.session import encode
    from sampling import autoregressive_generate
    from utils.models import load_embedded

    model, tokenizer = load_embedded()
    rows = []
    for item in load_prompts(PROMPTS, None, None):
        prompt = encode(tokenizer, item["turns"][0], True)
        output = autoregressive_generate(prompt, model, max_gen_len=length, eos_tokens_id=[tokenizer.eos_token_id], use_cache=True)
        rows.append(dict(category=item["category"], prompt=prompt, output=output))
    path.write_text(json.dumps(rows))
    return rows


def replay(drafter, prompt: List[int], output: List[int], most: int) -> List[int]:
    """(steps, accepted, drafted, tokens) of a greedy loop over ``output`` drafting at most ``most`` a step."""
    tokens, t, steps, accepted, drafted = list(prompt), 0, 0, 0, 0
    while t < len(output):
        draft = drafter.draft(tokens, most) if hasattr(drafter, "draft") else list(drafter._speculate(tokens, most, False).token_ids)
        n = 0
        while n < len(draft) and t + n < len(output) and draft[n] == output[t + n]:
            n += 1
        emitted = output[t : t + n + 1]
        tokens += emitted
        t, steps, accepted, drafted = t + len(emitted), steps + 1, accepted + n, drafted + len(draft)
    drafter.finish(output)
    return [steps, accepted, drafted, len(output)]


def table(name: str, rows: List[dict], make: Callable[[List[int]], object], most: int, only: str | None = None) -> List[str]:
    totals: Dict[str, List[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for row in rows:
        if only is None or row["category"] == only:
            for i, value in enumerate(replay(make(row["prompt"]), row["prompt"], row["output"], most)):
                totals[row["category"]][i] += value
    return [f"| {name} | {category} | {n / steps:.3f} | {drafted / steps:.2f} | {accepted / max(1, drafted):.2f} |"
            for category, (steps, accepted, drafted, n) in sorted(totals.items())]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--outputs", type=Path)
    args = parser.parse_args()
    from utils.models import cache_dir

    path = args.outputs or cache_dir() / f"suffix-replay-{args.max_new_tokens}.json"
    rows = json.loads(path.read_text()) if path.exists() else record(path, args.max_new_tokens)
    s = SuffixSettings()
    lines = ["| drafter | category | tokens/step | drafts/step | acceptance |", "| --- | --- | ---: | ---: | ---: |"]
    lines += table("ours", rows, lambda p: SuffixDrafter(p, **s.arguments()), s.max_spec_tokens)
    memory = SuffixMemory(s.max_tree_depth)
    lines += table("ours + global", rows, lambda p: SuffixDrafter(p, **s.arguments(), memory=memory), s.max_spec_tokens, "repeated_task")
    try:
        from drafters.arctic import ArcticSuffixDrafter, arctic_cache

        arctic_cache(s.max_tree_depth)
    except ImportError as error:
        lines.append(f"(the authors' drafter: {error})")
    else:
        lines += table("arctic", rows, lambda p: ArcticSuffixDrafter(arctic_cache(s.max_tree_depth), p, s), s.max_spec_tokens)
        cache = arctic_cache(s.max_tree_depth, global_memory=True)
        lines += table("arctic + global", rows, lambda p: ArcticSuffixDrafter(cache, p, s), s.max_spec_tokens, "repeated_task")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
