"""Bootstrap intervals of the benchmark's ratios, and how a ratio with its interval is written."""
from typing import Dict, List, Optional

RESAMPLES = 2000  # bootstrap resamples per interval
NO_DIFFERENCE = "~"  # a ratio whose 95% interval includes 1.0


def ratio_interval(mine: Dict[tuple, List[float]], theirs: Dict[tuple, List[float]], resamples: int = RESAMPLES,
                   seed: int = 0) -> Optional[tuple]:
    """95% percentile bootstrap interval of the ratio ``summarize`` reports: the median over repeats of
    (tokens/s of ``mine``) / (tokens/s of ``theirs``), each tokens/s summed tokens over summed seconds.

    ``mine`` and ``theirs`` map (item, repeat) -> [tokens, seconds]. Each resample draws the items
    and the repeats with replacement, the same draws for both sides (the pairing is kept), from a
    generator seeded with ``seed``. None when only one (item, repeat) pair is shared: no spread to
    resample (the table says "n=1")."""
    import numpy as np

    shared = mine.keys() & theirs.keys()
    repeats = sorted({repeat for _, repeat in shared})
    items = sorted({item for item, _ in shared if all((item, repeat) in shared for repeat in repeats)}, key=repr)
    if len(items) * len(repeats) < 2:
        return None
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(len(items), [1 / len(items)] * len(items), size=resamples).astype(float)  # items drawn
    drawn = rng.integers(0, len(repeats), size=(resamples, len(repeats)))  # repeats drawn

    def rates(cells: Dict[tuple, List[float]]):
        tokens, seconds = (np.array([[cells[(item, repeat)][k] for repeat in repeats] for item in items]) for k in (0, 1))
        per_repeat = (counts @ tokens) / (counts @ seconds)  # resample x repeat
        return np.take_along_axis(per_repeat, drawn, axis=1)

    ratios = np.median(rates(mine) / rates(theirs), axis=1)
    low, high = np.percentile(ratios, [2.5, 97.5])
    return float(low), float(high)


def ratio_cell(value: float, interval: Optional[tuple], exact: bool = False) -> str:
    """``1.52x [1.40-1.66]``, ``1.02x [0.97-1.08] ~`` (the interval includes 1.0), ``1.52x (n=1)``
    (one run: no interval); ``exact``: the baseline against itself, ``1.00x``."""
    if exact:
        return f"{value:.2f}x"
    if interval is None:
        return f"{value:.2f}x (n=1)"
    low, high = interval
    return f"{value:.2f}x [{low:.2f}-{high:.2f}]" + (f" {NO_DIFFERENCE}" if low <= 1.0 <= high else "")
