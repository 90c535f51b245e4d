"""The REPL's /stats: the start-up measurements in full, the last prompt's statistics per strategy, and the
global suffix memory's state."""
from rich.table import Table
from rich.text import Text

from utils.parsing import UsageError
from utils.printing import console


def suffix_memory_line(repl) -> str:
    """The global suffix memory's state, for /stats and the table's caption."""
    if repl.context.suffix_memory is None:
        return "suffix global memory: off"
    return f"suffix global memory: on, {repl.suffix_memory.describe()}"


def own_gamma_line(repl) -> str:
    """The rows under gamma auto of their own (``RunConfig.auto_rows``; ``strategies.auto_rows_line``), for
    /help's gamma and /stats: "N-gram assisted: gamma auto (4 first, up to 11)"; "" when none."""
    from strategies import STRATEGIES, auto_rows_line

    return auto_rows_line(STRATEGIES, repl.config, repl.context.drafter is not None)


def _startup(repl) -> None:
    """The start-up lines in full, as ``--verbose`` prints them: each model's, the measurements."""
    if repl.startup:
        console.print(Text("Start-up, in full:", style="bold"))
        for line in repl.startup:
            console.print(Text(line))


def _stats(repl):
    _startup(repl)
    if not repl.last:
        raise UsageError("no prompt yet: /stats shows the statistics of the last prompt")
    table = Table(title="Statistics of the last prompt")
    columns = ("strategy", "tokens", "target passes", "tok/step", "drafted", "accepted", "accept", "drafting s", "verifying s", "paused")
    for column in columns:
        table.add_column(column, justify="left" if column == "strategy" else "right")
    for strategy, r in repl.last:
        st = r.stats
        table.add_row(Text(strategy.title, style=strategy.color), str(st.generated), str(st.target_forward_passes),
                      f"{st.mean_accepted_tokens:.2f}", str(st.drafted), str(st.accepted), f"{st.acceptance_rate:.2f}",
                      f"{st.draft_seconds:.3f}", f"{st.verify_seconds:.3f}", str(st.paused_steps))
    console.print(table)
    for strategy, r in repl.last:
        if r.stats.drafted:
            rates = " ".join(f"{rate:.2f}" for rate in r.stats.per_position_acceptance)
            console.print(Text(f"{strategy.title}: acceptance by draft position: {rates}", style=strategy.color))
        if r.stats.accepted_by:
            shares = ", ".join(f"{k} {v}" for k, v in sorted(r.stats.accepted_by.items(), key=lambda i: -i[1]))
            console.print(Text(f"{strategy.title}: accepted drafts by source: {shares}", style=strategy.color))
        if r.stats.policy:  # the policy's automatic choice, and the measurement it chose from
            console.print(Text(f"{strategy.title}: {r.stats.policy}", style=strategy.color))
    policy = repl.context.policy(repl.config)
    own = own_gamma_line(repl)
    console.print(f"policy: {policy.describe(repl.config.gamma)}" + (f" · {own}" if own else "")
                  + ("" if policy.remember else " · memory off: each prompt starts fresh"))
    console.print(f"suffix: {repl.config.suffix.describe()} · {suffix_memory_line(repl)}")
