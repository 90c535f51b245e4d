"""``bench.py --replay``: n-gram storage hit rates over the prompts (or a corpus), no model forward pass."""
from pathlib import Path

from app.bench.prompts import load_prompts


def replay_report(args) -> None:
    """llama.cpp's lookup-stats: how often each storage would have predicted the next token."""
    from transformers import AutoTokenizer

    from ngram_assisted import replay
    from strategies import STORAGES
    from utils.models import embedded_model_dir, load_model

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir()) if not args.target else load_model(args.target, "cpu")[1]
    if args.corpus:
        texts = [Path(args.corpus).read_text(encoding="utf-8")]
    else:
        texts = [turn for row in load_prompts(args.prompts, args.categories, args.limit) for turn in row["turns"]]
    sequences = [tokenizer(t, add_special_tokens=False).input_ids for t in texts]
    print("| storage | n | positions | predicted | correct | precision |\n| --- | ---: | ---: | ---: | ---: | ---: |")
    for kind in args.storages.split(","):
        for n in args.ngram_n:
            totals = [0, 0, 0]
            for seq in sequences:
                for i, value in enumerate(replay(STORAGES[kind](n, len(tokenizer)), seq)):
                    totals[i] += value
            positions, predicted, correct = totals
            precision = correct / predicted if predicted else 0.0
            print(f"| {kind} | {n} | {positions} | {predicted / positions:.1%} | {correct / positions:.1%} | {precision:.1%} |")
