"""The benchmark's PNG plots: speedup by category, the gamma sweep, measured against theory,
acceptance by draft position."""
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional

from app.bench.report import ordered_categories


def plots(rows: List[dict], records: List[dict], out: Path) -> List[str]:
    """Draws each plot under ``out``; returns the names of the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # gamma auto has no number to plot against
    overall = [r for r in rows if r["category"] == "all" and r["acceptance"] is not None and isinstance(r["gamma"], int)]
    written = [_speedup_by_category(plt, rows, out)]
    if len({r["gamma"] for r in overall}) > 1:
        written.append(_gamma_sweep_plot(plt, overall, out))
    written.append(_theory(plt, rows, overall, out))
    written.append(_acceptance_by_position(plt, records, out))
    return written


def _save(plt, fig, out: Path, name: str) -> str:
    fig.tight_layout()
    fig.savefig(out / name, dpi=120)
    plt.close(fig)
    return name


def _speedup_by_category(plt, rows: List[dict], out: Path) -> str:
    categories = ordered_categories(rows)
    configs = sorted({r["config"] for r in rows if not r["setup"].strategy.baseline})
    fig, ax = plt.subplots(figsize=(max(8, len(categories) * 1.4), 5))
    width = 0.8 / max(1, len(configs))
    by_cell = {(r["category"], r["config"]): r for r in rows}
    for i, config in enumerate(configs):
        cells = [by_cell.get((c, config)) for c in categories]
        values = [r["speedup"] if r else 0 for r in cells]
        ax.bar([x + i * width for x in range(len(categories))], values, width, label=config,
               yerr=error_bars(cells), capsize=2, error_kw={"linewidth": 0.8})
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(categories))], categories, rotation=30, ha="right")
    ax.set_ylabel("speedup over target autoregressive")
    ax.legend(fontsize=7)
    return _save(plt, fig, out, "speedup_by_category.png")


def _gamma_sweep_plot(plt, overall: List[dict], out: Path) -> str:
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for family, points in gamma_sweep(overall).items():
        members = {r["gamma"]: r for r in overall if r["setup"].family == family}
        left.errorbar([p[0] for p in points], [p[1] for p in points], yerr=error_bars([members[p[0]] for p in points]),
                      marker="o", capsize=2, label=family)
        right.plot([p[0] for p in points], [p[2] for p in points], marker="o", label=family)
    left.set(xlabel="gamma", ylabel="speedup", xscale="log", title="speedup against gamma")
    right.set(xlabel="gamma", ylabel="acceptance rate", xscale="log", title="acceptance against gamma")
    left.legend(fontsize=7)
    return _save(plt, fig, out, "gamma_sweep.png")


def _theory(plt, rows: List[dict], overall: List[dict], out: Path) -> str:
    drafter_cost = _cost_ratio(rows)
    fig, ax = plt.subplots(figsize=(6, 5))
    for r in overall:
        c = drafter_cost if r["setup"].strategy.model_drafts else 0.0
        if c is None:
            continue
        ax.errorbar(theoretical_speedup(r["acceptance"], r["gamma"], c), r["speedup"], yerr=error_bars([r]), fmt="o", capsize=2,
                    label=r["config"])
    lim = max([1.5] + [r["speedup"] for r in overall] + [theoretical_speedup(r["acceptance"], r["gamma"], 0) for r in overall])
    ax.plot([0, lim], [0, lim], color="grey", linewidth=0.8)
    ax.set(xlabel="theoretical (1 - a^(g+1)) / ((1 - a)(g c + 1))", ylabel="measured speedup", title="measured against theory")
    ax.legend(fontsize=6)
    return _save(plt, fig, out, "theory.png")


def _acceptance_by_position(plt, records: List[dict], out: Path) -> str:
    fig, ax = plt.subplots(figsize=(7, 4))
    by_config = defaultdict(lambda: ([], []))
    for r in records:
        drafted, accepted = by_config[r["config"]]
        for i, (d, a) in enumerate(zip(r["drafted_at"], r["accepted_at"])):
            if i >= len(drafted):
                drafted.append(0)
                accepted.append(0)
            drafted[i] += d
            accepted[i] += a
    for config, (drafted, accepted) in sorted(by_config.items()):
        if drafted:
            ax.plot(range(1, len(drafted) + 1), [a / d if d else 0 for a, d in zip(accepted, drafted)], marker="o", label=config)
    ax.set(xlabel="draft position", ylabel="acceptance rate", title="acceptance by draft position", ylim=(0, 1.05))
    ax.legend(fontsize=7)
    return _save(plt, fig, out, "acceptance_by_position.png")


def error_bars(rows: List[Optional[dict]]) -> List[List[float]]:
    """matplotlib's yerr (below, above) for each row's speedup interval; 0 where there is none (n=1, baseline)."""
    below, above = [], []
    for r in rows:
        has = r is not None and r.get("speedup_low") is not None
        below.append(max(0.0, r["speedup"] - r["speedup_low"]) if has else 0.0)
        above.append(max(0.0, r["speedup_high"] - r["speedup"]) if has else 0.0)
    return [below, above]


def gamma_sweep(rows: List[dict]) -> Dict[str, List[tuple]]:
    """Per family (a configuration but its gamma), its (gamma, speedup, acceptance) points, by gamma."""
    families = defaultdict(list)
    for r in rows:
        families[r["setup"].family].append((r["gamma"], r["speedup"], r["acceptance"]))
    return {family: sorted(points) for family, points in sorted(families.items())}


def _cost_ratio(rows: List[dict]) -> Optional[float]:
    """Drafter time per token over target time per token, from the autoregressive runs of both."""
    target = next((r["tokens_per_s"] for r in rows if r["category"] == "all" and r["setup"].strategy.baseline), None)
    drafter = next((r["tokens_per_s"] for r in rows if r["category"] == "all" and r["setup"].strategy.drafter_ar), None)
    return target / drafter if target and drafter else None


def theoretical_speedup(a: float, gamma: int, c: float) -> float:
    """Leviathan et al. (2023), eq. 1: expected speedup for acceptance rate a, draft length gamma, cost ratio c."""
    if a >= 1.0:
        return (gamma + 1) / (gamma * c + 1)
    return (1 - a ** (gamma + 1)) / ((1 - a) * (gamma * c + 1))
