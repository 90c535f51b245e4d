"""The benchmark's configurations: a strategy with one set of parameters, and the grid the flags ask for."""
import importlib.util
import itertools
import sys
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Dict, List, Tuple

if TYPE_CHECKING:
    from strategies import Strategy  # imported when first needed: it loads torch


@dataclass(frozen=True)
class Config:
    """One strategy (its key in ``strategies``) with one set of parameters; those it does not take
    keep their defaults, so that equal settings make equal configurations."""

    key: str
    gamma: int | str = 4  # an int bounds the drafts per step; "auto" lets the calibrated policy choose
    n: int = 3
    storage: str = "basic"
    filler: int = 3
    params: Tuple[Tuple[str, Any], ...] = ()  # a registered row's own parameters (``strategies.Param``), by name

    @classmethod
    def of(cls, record: dict) -> "Config":
        """The configuration of a run record, from its typed fields (never from its label)."""
        config = cls(record["key"])
        strategy = config.strategy
        taken = (("gamma",) if strategy.takes_gamma else ()) + (("n", "storage", "filler") if strategy.takes_storage else ())
        params = tuple((p.name, (record.get("params") or {}).get(p.name, p.default)) for p in strategy.params)
        return replace(config, params=params, **{name: record[name] for name in taken if name in record})

    @property
    def strategy(self) -> "Strategy":
        from strategies import EVERY

        return EVERY[self.key]

    @property
    def label(self) -> str:
        return self._name(f"g={self.gamma}")

    @property
    def family(self) -> str:
        """The label without gamma: one line of the gamma sweep."""
        return self._name("")

    def _name(self, gamma: str) -> str:
        said = " ".join(f"{name}={value}" for name, value in self.params) if self.params else self.strategy.label_words
        words = ([f"{self.storage} n={self.n} k={self.filler}"] if self.strategy.takes_storage else []) + (
            [gamma] if gamma and self.strategy.takes_gamma else []) + ([said] if said else [])
        return f"{self.key}[{' '.join(words)}]" if words else self.key


def baseline() -> Config:
    """Target autoregressive: every ratio's denominator."""
    from strategies import EVERY

    return Config(next(key for key, strategy in EVERY.items() if strategy.baseline))


# transformers' peers (``strategies.PEERS``) that run only when named: our eager runner as a peer (beside
# --compile's compiled rows) and transformers' assisted generation at its own defaults (not at our gamma)
NAMED_ONLY = ("target_eager", "hf_assisted_default")


def default_strategies() -> str:
    """``--strategies``' default, read from the table: our rows that draft chains (``strategies.STRATEGIES``
    without ``trees``; the tree rows run when named), then ``strategies.PEERS`` but ``NAMED_ONLY``; each
    part ordered by what it needs (the baseline, nothing, a drafter model, a draft head), else as in the table."""
    from strategies import PEERS, STRATEGIES

    def needs(strategy):
        return not strategy.baseline, strategy.needs_head, strategy.needs_drafter

    ours = sorted((s for s in STRATEGIES if not s.trees), key=needs)
    return ",".join(s.key for s in ours + sorted((p for p in PEERS if p.key not in NAMED_ONLY), key=needs))


def make_configs(args, have_drafter: bool, have_head: bool = False) -> List[Config]:
    from strategies import EVERY

    configs = []
    for key in [k.strip() for k in (args.strategies or default_strategies()).split(",") if k.strip()]:
        if key not in EVERY:
            raise SystemExit(f"error: unknown strategy {key!r}; known: {', '.join(EVERY)}")
        strategy = EVERY[key]
        if strategy.needs_drafter and not have_drafter:
            continue
        if strategy.needs_head and not have_head:
            print(f"skipped {key}: no draft head (--head PATH)", file=sys.stderr)
            continue
        if strategy.requires and importlib.util.find_spec(strategy.requires) is None:
            print(f"skipped {key}: {strategy.requires} is not installed (optional)", file=sys.stderr)
            continue
        why = strategy.unavailable(args) if strategy.unavailable is not None else ""
        if why:
            print(f"skipped {key}: {why}", file=sys.stderr)
            continue
        grid = {"gamma": [g for g in args.gamma if g != "auto" or strategy.auto_gamma]} if strategy.takes_gamma else {}
        if strategy.takes_storage:
            grid.update(n=args.ngram_n, storage=strategy.storages or args.storages.split(","), filler=args.top_k_filler)
        asked: Dict[str, list] = dict(getattr(args, "param", None) or [])
        own = [[(p.name, value) for value in asked.get(p.name, [p.default])] for p in strategy.params]
        configs += [Config(key, params=tuple(params), **dict(zip(grid, values)))
                    for values in itertools.product(*grid.values()) for params in itertools.product(*own)]
    if baseline() not in configs:
        configs.insert(0, baseline())
    return list(dict.fromkeys(configs))  # a repeated flag value runs its configuration once


def refuse_trees(target, config: Config) -> bool:
    """Whether ``target`` cannot verify the draft trees of ``config``'s strategy (said on stderr, in one line)."""
    from runners import tree_unsupported

    reason = tree_unsupported(target)
    if reason is not None:
        print(f"{config.key} left out: {reason}", file=sys.stderr)
    return reason is not None
