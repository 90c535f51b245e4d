"""What copying from the prompt and the output so far can reach on input-grounded prompts, without a
policy and without the target: target AR's greedy tokens replayed against drafters that never see them
(counts, not clocks; the embedded model, greedy). For each rule, passes and tokens per unit of the
given pass costs (README session's, as ``grounded_counts.py``), beside the copy oracle:

* ``chain m``: one candidate a step, the continuation (up to 10) of the earlier occurrence of the last
  token whose preceding context matches longest (the most recent on a tie), drafted when that match
  is at least ``m`` tokens long (a suffix-array lookup over the prompt and the output so far);
* ``tree w x d``: the first tokens of the ``w`` best occurrences' distinct continuations, the best
  one's continued to depth ``d`` (``w + d - 1`` nodes at most), verified in one pass;
* ``oracle``: ``grounded_counts.copy_oracle``'s copier, drafting exactly the run that will be accepted
  (the fewest passes, at the least cost any copier pays for them).

    .venv/bin/python scripts/grounded_ceiling.py --prompts ../shared/specbench/question.jsonl \
        --categories summarization,rag --limit 4 --max-new-tokens 64
"""
import argparse
import sys
from collections import defaultdict
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grounded_counts import ROW_COSTS, prompt_arguments  # noqa: E402
from drafters.copy_tree import CAP, copy_tree, occurrences  # noqa: E402 (the library's tree: strategy tree_copy)


def chain(min_match: int, count: int = 10) -> Callable[[List[int]], Dict]:
    """The one-candidate copier: a trie holding one path (see the module)."""
    def draft(seq: List[int]) -> Dict:
        found = occurrences(seq)
        if not found or found[0][0] < min_match:
            return {}
        return _path(seq[found[0][1] + 1 : found[0][1] + 1 + count])
    return draft


def tree(width: int, depth: int) -> Callable[[List[int]], Dict]:
    """First tokens of the ``width`` best occurrences' distinct continuations; the best one's to ``depth``
    (``drafters.copy_tree.copy_tree``, every node verified: no policy)."""
    def draft(seq: List[int]) -> Dict:
        nodes, parents, _ = copy_tree(seq, occurrences(seq), width, depth)
        root: Dict = {}
        made: List[Dict] = []
        for token, parent in zip(nodes, parents):
            made.append((root if parent < 0 else made[parent]).setdefault(token, {}))
        return root
    return draft


def _path(tokens: Sequence[int]) -> Dict:
    root: Dict = {}
    node = root
    for token in tokens:
        node = node.setdefault(token, {})
    return root


def _size(node: Dict) -> int:
    return sum(1 + _size(child) for child in node.values())


def replay(prompt: List[int], out: List[int], rule: Callable[[List[int]], Dict], costs: Sequence[float]) -> Tuple[int, float]:
    """(passes, summed pass cost) of ``out`` drafted by ``rule``: each step keeps the longest path of the
    rule's trie that ``out`` follows, plus the target's own token."""
    seq, i, passes, cost = list(prompt), 0, 0, 0.0
    while i < len(out):
        node, n = rule(seq), 0
        rows = 1 + _size(node)
        while i + n < len(out) - 1 and out[i + n] in node:
            node, n = node[out[i + n]], n + 1
        seq += out[i : i + n + 1]
        i, passes, cost = i + n + 1, passes + 1, cost + costs[min(rows, len(costs)) - 1]
    return passes, cost


RULES = {f"chain {m}": chain(m) for m in (1, 2, 3, 4)} | {f"tree {w} x {d}": tree(w, d) for w, d in ((2, 1), (2, 3), (3, 3), (4, 4), (3, 14))}


def main() -> None:
    from app.bench.prompts import load_prompts
    from app.session import encode
    from sampling import autoregressive_generate
    from utils.models import load_embedded

    args = prompt_arguments(argparse.ArgumentParser(description=__doc__.split("\n")[0])).parse_args()
    model, tokenizer = load_embedded()
    table: Dict[str, Dict[str, List[float]]] = defaultdict(lambda: defaultdict(lambda: [0, 0.0, 0]))
    for row in load_prompts(args.prompts, args.categories, args.limit):
        prompt = encode(tokenizer, row["turns"][0], True)
        out = list(autoregressive_generate(prompt, model, max_gen_len=args.max_new_tokens, eos_tokens_id=tokenizer.eos_token_id,
                                           use_cache=True))
        cells = table[row["category"]]
        for name, rule in RULES.items():
            passes, cost = replay(prompt, out, rule, ROW_COSTS)
            cells[name][0] += passes
            cells[name][1] += cost
            cells[name][2] += len(out)
        passes, cost = replay(prompt, out, _oracle(prompt, out), ROW_COSTS)
        cells["oracle"][0] += passes
        cells["oracle"][1] += cost
        cells["oracle"][2] += len(out)
    for category, cells in table.items():
        print(f"== {category}")
        for name, (passes, cost, tokens) in cells.items():
            print(f"   {name:12s} passes {passes:4d} tok/pass {tokens / passes:.2f} tokens per unit of cost {tokens / cost:.3f}")


def _oracle(prompt: List[int], out: List[int]) -> Callable[[List[int]], Dict]:
    """The copy oracle as a rule: the run ``copy_oracle`` would accept at this point, drafted exactly."""
    def draft(seq: List[int]) -> Dict:
        i = len(seq) - len(prompt)
        best: List[int] = []
        for start in range(len(seq) - 1):
            if seq[start] != seq[-1]:
                continue
            run = 0
            while run < CAP and i + run < len(out) - 1 and start + 1 + run < len(seq) and seq[start + 1 + run] == out[i + run]:
                run += 1
            if run > len(best):
                best = out[i : i + run]
        return _path(best)
    return draft


if __name__ == "__main__":
    main()
