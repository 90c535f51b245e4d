"""The benchmark's summary and tables: statistics per category and configuration (with bootstrap
intervals), the markdown report, the kernels section, the table against the peers, the divergence
columns, and the ``--strict`` gate."""
import statistics
from collections import defaultdict
from typing import TYPE_CHECKING, Dict, List, Optional

from app.bench.configs import Config, baseline
from app.bench.intervals import NO_DIFFERENCE, RESAMPLES, ratio_cell, ratio_interval
from app.bench.prompts import DEFAULT_GROUP

if TYPE_CHECKING:
    from strategies import Strategy


def summarize(records: List[dict], groups: tuple = (DEFAULT_GROUP,)) -> List[dict]:
    """Per category (and 'all', and each group of categories present) and configuration: tokens/s
    (median over repeats, spread), speedup over target autoregressive within each repeat and against
    each peer run alongside, each with its bootstrap interval (``ratio_interval``), acceptance,
    tokens and drafts per step, divergences (classified: ``divergence_columns``)."""
    present = {r["category"] for r in records}
    memberships = defaultdict(list)
    for name, members in groups:
        if len(present & set(members)) > 1:
            for category in members:
                memberships[category].append(name)
    setups = {r["config"]: Config.of(r) for r in records}
    labels = {setup: label for label, setup in setups.items()}
    base_label = labels.get(baseline())
    groups = defaultdict(list)
    cells = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))  # (category, config) -> (item, repeat) -> [tokens, seconds]
    for r in records:
        for category in (r["category"], "all", *memberships[r["category"]]):
            groups[(category, r["config"], r["repeat"])].append(r)
            cell = cells[(category, r["config"])][((r["category"], r.get("question_id"), r.get("turn", 0)), r["repeat"])]
            cell[0] += r["new_tokens"]
            cell[1] += r["seconds"]
    per_repeat, decoding = {}, {}
    for (category, config, repeat), runs in groups.items():
        tokens = sum(r["new_tokens"] for r in runs)
        seconds = sum(r["seconds"] for r in runs)
        per_repeat[(category, config, repeat)] = (tokens / seconds if seconds else 0.0, runs)
        decoding[(category, config, repeat)] = decoding_rate(runs)
    rows = []
    for category, config in sorted({(c, k) for c, k, _ in per_repeat}):
        repeats = sorted(rep for c, k, rep in per_repeat if (c, k) == (category, config))
        tps = [per_repeat[(category, config, rep)][0] for rep in repeats]
        base = [per_repeat.get((category, base_label, rep), (0.0,))[0] for rep in repeats]
        speedups = [t / b for t, b in zip(tps, base) if b]
        decode = [(decoding[(category, config, rep)], decoding.get((category, base_label, rep))) for rep in repeats]
        decode_speedups = [t / b for t, b in decode if t and b]
        runs = [r for rep in repeats for r in per_repeat[(category, config, rep)][1]]
        setup = setups[config]
        versus, versus_ci = {}, {}  # median over repeats of tokens/s against each transformers path run alongside
        for peer in compared_peers(setup.strategy):
            label = labels.get(Config.of({"key": peer, "gamma": setup.gamma}))
            ratios = [t / per_repeat[(category, label, rep)][0] for t, rep in zip(tps, repeats)
                      if per_repeat.get((category, label, rep), (0.0,))[0]]
            if ratios:
                versus[peer] = statistics.median(ratios)
                versus_ci[peer] = ratio_interval(cells[(category, config)], cells[(category, label)])
        speedup_ci = None if setup.strategy.baseline or not speedups else ratio_interval(
            cells[(category, config)], cells[(category, base_label)])
        drafted, accepted = sum(r["drafted"] for r in runs), sum(r["accepted"] for r in runs)
        steps = sum(r["target_passes"] for r in runs)
        median = statistics.median(tps)
        rows.append({
            "category": category, "scope": "all" if category == "all" else "group" if category not in present else "category",
            "config": config, "key": runs[0]["key"], "gamma": runs[0]["gamma"],
            "tokens_per_s": median, "spread_pct": 100 * (max(tps) - min(tps)) / median if median else 0.0,
            "speedup": statistics.median(speedups) if speedups else 0.0,
            "speedup_low": speedup_ci[0] if speedup_ci else None, "speedup_high": speedup_ci[1] if speedup_ci else None,
            "decoding_speedup": statistics.median(decode_speedups) if decode_speedups else None,
            "drafts_per_step": drafted / steps if steps and drafted else None,
            "max_draft": max((len(r.get("drafted_at") or []) for r in runs), default=0) if drafted else None,
            "acceptance": sum(r["accepted"] for r in runs) / drafted if drafted else None,
            # drafting rows only; a peer that says its steps but not its drafts (OpenVINO) shows them once it accepted some
            "tokens_per_step": sum(r["new_tokens"] for r in runs) / steps if steps and (drafted or accepted) else None,
            "runs": len(runs), "noisy_runs": sum(bool(r.get("noisy")) for r in runs),
            "others_cores": max((r["others_cores"] for r in runs if r.get("others_cores") is not None), default=None),
            "diverged": sum(r["diverged_at"] is not None for r in runs), **divergence_columns(runs),
            "versus": versus, "versus_ci": versus_ci, "setup": setup,
        })
    return rows


def decoding_rate(runs: List[dict]) -> Optional[float]:
    """Tokens/s after the prompt's pass (``first_step_seconds``, which emits the first token): the tokens a
    drafter can speed up over the time they took; None where a run did not record its prompt's pass (peers)."""
    if any(not r.get("first_step_seconds") for r in runs):
        return None
    tokens = sum(r["new_tokens"] - 1 for r in runs)
    seconds = sum(r["seconds"] - r["first_step_seconds"] for r in runs)
    return tokens / seconds if tokens > 0 and seconds > 0 else None


def compared_peers(strategy: "Strategy") -> List[str]:
    """The transformers paths one of our strategies is compared with: those taking no gamma (a drafter
    model's only for a strategy with one), and its own peer (run at the same gamma); for a peer row, the
    row of its own engine it names (``Strategy.versus``)."""
    from strategies import PEERS

    if strategy.peer:  # a peer row: its own engine's baseline only (OpenVINO's prompt lookup against its plain decoding)
        return [strategy.versus] if strategy.versus else []
    return [p.key for p in PEERS if p.key == strategy.gamma_peer or (
        not p.takes_gamma and (not p.needs_drafter or strategy.needs_drafter))]


def divergence_columns(runs: List[dict]) -> dict:
    """Near-ties, disagreements, unclassified divergences, and the largest |margin| and rounding
    difference among the classified ones (None when there is none)."""
    found = [r["divergence"] for r in runs if r.get("divergence")]
    verdicts = [d["verdict"] for d in found]
    margins = [d for d in found if d.get("margin") is not None]
    return {"near_ties": verdicts.count("near-tie"), "disagreements": verdicts.count("disagreement"),
            "unclassified": verdicts.count("unclassified"),
            "max_margin": max((d["margin"] for d in margins), default=None),
            "max_rounding": max((d["rounding"] for d in margins), default=None)}


def divergence_cell(r: dict) -> str:
    """The table's "greedy divergences" cell: "0/6", or "2/6: 2 near-ties, margin <= 0.004, rounding <= 0.006"."""
    cell = f"{r['diverged']}/{r['runs']}"
    if not r["diverged"]:
        return cell
    names = (("near_ties", "near-tie", "near-ties"), ("disagreements", "disagreement", "disagreements"),
             ("unclassified", "unclassified", "unclassified"))
    parts = [f"{r[key]} {one if r[key] == 1 else many}" for key, one, many in names if r.get(key)]
    if r.get("max_margin") is not None:
        parts.append(f"margin <= {r['max_margin']:.2g}, rounding <= {r['max_rounding']:.2g}")
    return cell + (": " + ", ".join(parts) if parts else "")


def versus_column(row: dict, peer: str, end: str) -> object:
    """summary.csv's vs_PEER, vs_PEER_low and vs_PEER_high cells (empty: not run, or no interval at n=1)."""
    if end == "":
        return row["versus"].get(peer, "")
    interval = row["versus_ci"].get(peer)
    return "" if interval is None else interval[end == "_high"]


def versus_table(rows: List[dict]) -> List[str]:
    """Each of our strategies against transformers' paths run in the same repeats (ratio of tokens/s)."""
    from strategies import EVERY

    peers = sorted({p for r in rows for p in r.get("versus", {})})
    if not peers:
        return []
    lines = ["## against the peers run alongside", "", "Tokens/s ratio, median over repeats, with its 95% bootstrap interval, "
             "against " + ", ".join(f"{EVERY[p].peer} ({EVERY[p].title})" for p in peers) + ":", "",
             "| category | strategy | " + " | ".join(f"vs {EVERY[p].peer}" for p in peers) + " |",
             "| --- | --- |" + " ---: |" * len(peers)]
    order = ordered_categories(rows)
    for r in sorted((r for r in rows if r.get("versus")), key=lambda r: (order.index(r["category"]), r["config"])):
        lines.append(f"| {r['category']} | {r['config']} | "
                     + " | ".join(ratio_cell(r["versus"][p], r.get("versus_ci", {}).get(p)) if p in r["versus"] else "-"
                                  for p in peers) + " |")
    return lines + [""]


def ordered_categories(rows: List[dict]) -> List[str]:
    """Categories first, then groups of categories, then 'all'."""
    scope = {r["category"]: r.get("scope", "all" if r["category"] == "all" else "category") for r in rows}
    return sorted(scope, key=lambda c: (["category", "group", "all"].index(scope[c]), c))


def speedup_matrix(rows: List[dict]) -> List[str]:
    """One line per configuration, one column per category: the speedups at a glance."""
    categories = ordered_categories(rows)
    configs = sorted({r["config"] for r in rows}, key=lambda c: -next(r["speedup"] for r in rows if r["config"] == c and r["category"] == "all"))
    speed = {(r["category"], r["config"]): speedup_cell(r) for r in rows}
    lines = ["| strategy | " + " | ".join(categories) + " |", "| --- |" + " ---: |" * len(categories)]
    for config in configs:
        cells = [speed.get((c, config), "-") for c in categories]
        lines.append(f"| {config} | " + " | ".join(cells) + " |")
    return lines + [""]


def speedup_cell(r: dict) -> str:
    """A summary row's speedup over target AR with its interval (``ratio_cell``)."""
    interval = (r["speedup_low"], r["speedup_high"]) if r.get("speedup_low") is not None else None
    return ratio_cell(r["speedup"], interval, exact=r["setup"].strategy.baseline)


LEGEND = (f"Ratios: median over repeats [95% bootstrap interval over prompts and repeats, {RESAMPLES} resamples]; "
          f"{NO_DIFFERENCE}: no measurable difference (the interval includes 1.00x); n=1: one prompt, one repeat, no interval. "
          "Drafts/step: mean drafted tokens per target pass (the longest draft). Decoding speedup: tokens/s after the "
          "prompt's pass (it emits the first token; no drafter shortens it) over target AR's, median over repeats.")


def markdown(rows: List[dict], title: str, quiet: str = "") -> str:
    """The report; ``quiet``: the line on the machine's load during the timed runs (``load_line``)."""
    lines = [f"# {title}", ""] + ([quiet, ""] if quiet else []) + [LEGEND, "", "Speedup over target autoregressive, by category:",
                                                                   ""] + speedup_matrix(rows)
    for category in ordered_categories(rows):
        lines += [f"## {category}", "",
                  "| strategy | tokens/s | speedup | decoding speedup | tokens/step | drafts/step | acceptance | greedy divergences |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for r in sorted((r for r in rows if r["category"] == category), key=lambda r: -r["speedup"]):
            step = f"{r['tokens_per_step']:.2f}" if r["tokens_per_step"] is not None else "-"
            drafts = f"{r['drafts_per_step']:.1f} (max {r['max_draft']})" if r.get("drafts_per_step") is not None else "-"
            acc = f"{r['acceptance']:.2f}" if r["acceptance"] is not None else "-"
            noisy = f" (noisy: {r['noisy_runs']}/{r['runs']} runs)" if r.get("noisy_runs") else ""
            decode = f"{r['decoding_speedup']:.2f}x" if r.get("decoding_speedup") is not None else "-"
            lines.append(f"| {r['config']}{noisy} | {r['tokens_per_s']:.1f} ± {r['spread_pct']:.0f}% | {speedup_cell(r)} | {decode} | {step} | {drafts} | "
                         f"{acc} | {divergence_cell(r)} |")
        lines.append("")
    return "\n".join(lines + versus_table(rows))


def kernels_report(records: List[dict], measured: str) -> str:
    """The report's section on the target's linear layers: one line when every row ran the same, else
    one row each (a transformers peer on those of the row it is compared with); empty when nothing chose."""
    ran = {r["config"]: r.get("kernels", "") for r in records}
    if not any(ran.values()):
        return ""
    ran = {config: kernels or "own (no choice made)" for config, kernels in ran.items()}  # "": the model's own, unchosen
    lines = ["", "## kernels", "", f"The target's linear layers, each row on those its passes run fastest on ({measured}).", ""]
    if len(set(ran.values())) == 1:
        return "\n".join(lines + [f"Every row: {next(iter(ran.values()))} linear layers.", ""])
    lines += ["| row | linear layers |", "| --- | --- |"] + [f"| {config} | {kernels} |" for config, kernels in sorted(ran.items())]
    return "\n".join(lines + [""])


def sources_report(records: List[dict]) -> str:
    """The report's section on a merged tree's sources: accepted drafts by the source that proposed
    them, summed over every prompt and repeat of a row (empty when no row has sources)."""
    totals: Dict[str, Dict[str, int]] = {}
    for r in records:
        for source, count in (r.get("accepted_by") or {}).items():
            row = totals.setdefault(r["config"], {})
            row[source] = row.get(source, 0) + count
    if not totals:
        return ""
    lines = ["", "## accepted drafts by source", "", "| row | accepted | by source |", "| --- | ---: | --- |"]
    for config, row in sorted(totals.items()):
        shares = ", ".join(f"{source} {count}" for source, count in sorted(row.items(), key=lambda item: -item[1]))
        lines.append(f"| {config} | {sum(row.values())} | {shares} |")
    return "\n".join(lines + [""])


def depth_report(records: List[dict], deepest: int = 8) -> str:
    """The report's section on acceptance by draft depth: per row, of the drafts at depth d (a chain's
    d-th draft, a tree's nodes d deep), the share the target accepted, summed over every run; empty
    when nothing drafted."""
    totals: Dict[str, List[List[int]]] = {}
    for r in records:
        drafted, accepted = totals.setdefault(r["config"], [[0] * deepest, [0] * deepest])
        for d, (n, a) in enumerate(zip((r.get("drafted_at") or [])[:deepest], (r.get("accepted_at") or [])[:deepest])):
            drafted[d] += n
            accepted[d] += a
    rows = {config: pair for config, pair in totals.items() if pair[0][0]}
    if not rows:
        return ""
    depth = max(max(i + 1 for i, n in enumerate(drafted) if n) for drafted, _ in rows.values())
    lines = ["", "## acceptance by draft depth", "", "Of the drafts at depth d, the share the target accepted.", "",
             "| row | " + " | ".join(str(d) for d in range(1, depth + 1)) + " |", "| --- |" + " ---: |" * depth]
    for config, (drafted, accepted) in sorted(rows.items()):
        cells = [f"{a / n:.2f}" if n else "-" for n, a in zip(drafted[:depth], accepted[:depth])]
        lines.append(f"| {config} | " + " | ".join(cells) + " |")
    return "\n".join(lines + [""])


def load_line(records: List[dict]) -> str:
    """The report's line on the machine's quiet during the timed runs (``utils.load``); "" for records without it."""
    from utils.load import LoadSummary

    summary = LoadSummary.of(records)
    return "" if summary is None else summary.line()


def ran(records: List[dict]) -> List[dict]:
    """The records of runs that ran (a failed run's record has ``failed``: its reason)."""
    return [r for r in records if not r.get("failed")]


def failed_section(records: List[dict]) -> str:
    """The report's section on the runs that failed, a line per row (how many, the first reason); "" when none did."""
    failed: dict = {}
    for r in records:
        if r.get("failed"):
            failed.setdefault(r["config"], []).append(r["failed"])
    if not failed:
        return ""
    lines = "".join(f"| {label} | {len(reasons)} | {reasons[0].replace('|', '/')} |\n" for label, reasons in failed.items())
    return ("\n## failed rows\n\nRuns that failed (the other rows went on; a row that failed in the warm-up was not timed):\n\n"
            "| configuration | failed runs | first reason |\n| --- | ---: | --- |\n" + lines)


def check_ours(records: List[dict]) -> None:
    """Exit with status 1, in one line, when a run of one of our rows failed (a bug of ours; the reports are
    written first). A peer's failure is the peer's: reported, not an error (unless ``--strict``)."""
    from strategies import EVERY

    ours = [r for r in records if r.get("failed") and r["key"] in EVERY and not EVERY[r["key"]].peer]
    if ours:
        first = ours[0]
        where = f"on question {first['question_id']}" if "question_id" in first else "in the warm-up"
        raise SystemExit(f"error: {len(ours)} run(s) of our rows failed (first: {first['config']} {where}: {first['failed']})")


def check_strict(records: List[dict], strict: bool) -> None:
    """With ``--strict``: exit with status 1, in one line, when any divergence is a disagreement, or
    when any timed run was noisy (other processes above the ``--busy`` limit), or when any run failed."""
    if not strict:
        return
    failed = [r for r in records if r.get("failed")]
    if failed:
        raise SystemExit(f"error: --strict: {len(failed)} run(s) failed (first: {failed[0]['config']}: {failed[0]['failed']})")
    records = ran(records)
    bad = [r for r in records if (r.get("divergence") or {}).get("verdict") == "disagreement"]
    if bad:
        raise SystemExit(f"error: --strict: {len(bad)} greedy divergence(s) are disagreements, not rounding near-ties "
                         f"(first: {bad[0]['config']} on question {bad[0]['question_id']} at token {bad[0]['diverged_at']})")
    noisy = [r for r in records if r.get("noisy")]
    if noisy:
        raise SystemExit(f"error: --strict: {len(noisy)} of {len(records)} timed runs were noisy: other processes used more than "
                         f"{noisy[0].get('busy_limit', 0.3):g} cores (first: {noisy[0]['config']} on question "
                         f"{noisy[0]['question_id']}, {noisy[0]['others_cores']:.2f} cores)")
