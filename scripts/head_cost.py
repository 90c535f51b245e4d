"""What a draft step of a learned head costs next to a target pass, on this machine:

    python scripts/head_cost.py [--head heads/smollm2-135m-eagle3] [--context 300] [--rounds 50]

The embedded target on its measured kernels (``choose_kernels``), the caches holding ``--context``
positions; medians over ``--rounds`` interleaved rounds of: a target pass over 1 and over 5 new
positions, a head step (1 position: a chain's draft) and a tree depth (4 positions). Run it alone
(``../shared/tools/quiet -- python scripts/head_cost.py``): it is a timing.
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.heads import SHIPPED  # noqa: E402
from eagle.cost import HeadTimer  # noqa: E402
from eagle.format import load_head  # noqa: E402
from measure import PassTimer, choose_kernels, compared  # noqa: E402
from utils.models import load_embedded  # noqa: E402


@torch.no_grad()
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--head", default=str(SHIPPED))
    p.add_argument("--context", type=int, default=300)
    p.add_argument("--rounds", type=int, default=50)
    args = p.parse_args()
    target, _ = load_embedded()
    _, line = choose_kernels(target)
    head = load_head(args.head, target)
    target_timer, head_timer = PassTimer(target, args.context, 5), HeadTimer(head, args.context)
    medians, _ = compared([(target_timer, 1), (target_timer, 5), (head_timer, 1), (head_timer, 4)], args.rounds, None)
    one, five, step, depth = (1000 * m for m in medians)
    print(line)
    print(f"target pass, {args.context} cached: 1 new position {one:.2f} ms, 5 new positions {five:.2f} ms")
    print(f"head step (1 position) {step:.2f} ms = {100 * step / one:.1f}% of a 1-position target pass; "
          f"tree depth (4 positions) {depth:.2f} ms = {100 * depth / one:.1f}%")


if __name__ == "__main__":
    main()
