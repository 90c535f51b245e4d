"""The compiled step (``runners.step``, the runner on CUDA of the models the lean forward takes) made
ready for the programs' rows before anything is timed: the pass widths each enabled row feeds, and the
key buckets its prompts meet. The REPL calls ``ready`` before each prompt's rows, the benchmark once
before its timed runs; graphs already built cost nothing, and a timed pass never builds one
(``StepState.lazy`` is off once a graph was prepared). On CUDA a model the step cannot take runs
transformers' forward compiled where it is ready within ``FIRST_ANSWER_LIMIT``, else eager with one
line saying why (``cuda_default``)."""
from typing import Callable, Iterable, Sequence, Tuple

START_LENGTH = 192  # the start-up measurements' contexts (128 positions plus 12 rows): the first key bucket only
# the seconds a start may spend building transformers' compiled forward for a model the step cannot take
# (CUDA's default: ``RunnerConfig.compiles_by_default``) before its first answer; past them it runs eager
FIRST_ANSWER_LIMIT = 120.0


def on_cuda(model) -> bool:
    """Whether ``model``'s weights are on a CUDA device (read off its first parameter)."""
    weight = next(model.parameters(), None)
    return weight is not None and weight.device.type == "cuda"


def cuda_decides(config, model) -> bool:
    """Whether CUDA's default, not a flag, makes ``model`` run other than on the step under ``config``
    (a ``RunnerConfig``): transformers' compiled forward (``compiles_by_default``), or eager for a model
    that cannot compile (``why_not_compiled``). Off CUDA never (asked without entering the runner's
    config: the start-up enters each file by few routes, tests/test_startup_trace.py)."""
    if not on_cuda(model):
        return False
    if config.compiles_by_default(model):
        return True
    return not (config.compile or config.eager or config.forward != "auto") and bool(config.eager_reason(model))


def cuda_default(model, role: str, config, options, say: Callable[..., None]) -> Tuple[object, float]:
    """``config`` for a model ``cuda_decides`` on, and the seconds spent compiling: ``compiled_within``'s,
    or, for a model that cannot compile, the same, with one line saying why it runs eager."""
    if config.compiles_by_default(model):
        return compiled_within(model, role, config, options, say)
    say(f"The {role} runs eager on CUDA: {config.eager_reason(model)}", "red")
    return config, 0.0


def compiled_within(model, role: str, config, options, say: Callable[..., None]) -> Tuple[object, float]:
    """``config`` (a ``RunnerConfig`` compiling ``model`` by CUDA's default) where transformers' compiled
    forward is ready within ``options.first_answer_limit`` seconds (``runners.compiled.prepare``'s
    ``limit``: each bucket's graph, at ``options.compile_length`` positions); else the same run eager,
    with one line (``say``, and the header: ``RunnerConfig.why_eager``) saying why. A later start
    finds the graphs built so far in inductor's disk cache. With the seconds spent compiling (0: eager)."""
    from runners import NotReady, compile_source, prepare

    try:
        seconds = prepare(model, options.compile_length, lambda text: say(f"{role}: {text} ...", "dim"), config=config,
                          limit=options.first_answer_limit)
    except NotReady as error:
        why = f"transformers' compiled forward not ready in time: {error}; --compile waits for it"
        say(f"The {role} runs eager on CUDA: {why}", "red")
        return config.with_(why_eager=why), 0.0
    say(f"Compiled the {role} (transformers' forward, CUDA's default for a model the step cannot take) in {seconds:.1f} s "
        f"({compile_source(model) or 'nothing new'}; outside every timed run)")
    return config, seconds


def start_graphs(model, role: str, options, say: Callable[[str], None]) -> float:
    """The compiled step's graphs at start-up (``options``: ``app.pair.LoadOptions``): width 1 first, then the
    start-up measurements' widths (the drafter: 1 and the widest), the first key bucket only, with a
    head's hidden states for the target where one will draft; each row's other widths and buckets are
    built before it runs (``ready``). Returns the seconds spent."""
    from runners import prepare_step

    layers = options.hidden_layers if role == "target" else ()
    widths = options.step_widths if role == "target" else (1, max(options.step_widths))
    return prepare_step(model, START_LENGTH, lambda text: say(f"{role}: {text} ..."), layers, widths, graphs=options.step_graphs)


def most_drafts(config, drafts: int) -> int:
    """The most drafts a step may ask for where a row's own bound is ``drafts``: that bound, or under
    ``/gamma auto`` the calibrated policy's own (``DraftPolicy.start``'s ``limit``: up to the longest
    measured pass, so 11 drafts on the start-up's 12 rows) where it is larger."""
    policy = config.policy
    bound = policy.bound()
    return drafts if bound is None else max(drafts, min(policy.max_gamma, bound))


def row_rows(strategy, config) -> int:
    """The most positions one pass of ``strategy``'s row feeds the target: its drafts a step (its
    spec's budget, else the run's ``gamma``; ``most_drafts`` under ``/gamma auto``) plus one; 1 for a
    row that does not draft."""
    if not strategy.speculative or strategy.peer:
        return 1
    budget = strategy.spec(config).budget() if strategy.spec is not None else None
    return 1 + most_drafts(config, int(budget or config.gamma))


Rows = Sequence[Tuple[object, object]]  # (a ``strategies.Strategy``, the ``RunConfig`` it runs with)


def drafts_with_head(strategy) -> bool:
    """Whether ``strategy``'s row drafts with the learned head when one is loaded: an EAGLE row, or the
    merged tree (the head is one of its sources)."""
    return strategy.needs_head or strategy.key == "merged"


def step_widths(rows: Rows) -> Tuple[int, ...]:
    """The widths the target's passes pad to for ``rows``: 1, and each drafting row's most rows (a pass
    of fewer rows pads to the next of them: on a GPU a padded pass costs about what its rows do)."""
    return tuple(sorted({1} | {row_rows(strategy, config) for strategy, config in rows}))


def drafter_widths(rows: Rows) -> Tuple[int, ...]:
    """The drafter model's widths: 1 (drafting) and its most drafts plus one (catching up on accepted
    tokens: ``gamma + 1``, or ``most_drafts`` + 1 under ``/gamma auto``) for each row that drafts with
    it; () where none does."""
    return tuple(sorted({1} | {1 + most_drafts(config, int(config.gamma)) for strategy, config in rows
                               if strategy.needs_drafter})) \
        if any(strategy.needs_drafter for strategy, _ in rows) else ()


def head_widths(rows: Rows) -> Tuple[int, ...]:
    """The head's widths past its own (``eagle.head_step.WIDTHS``): a catch-up on accepted tokens feeds
    it up to ``most_drafts`` + 1 rows for each row that drafts with it (12 under ``/gamma auto``)."""
    return tuple(sorted({1 + most_drafts(config, int(config.gamma)) for strategy, config in rows if drafts_with_head(strategy)}))


def ready(target, drafter, runners: dict, rows: Rows, first: int, last: int, say: Callable[[str], None], head=None) -> float:
    """Build every graph ``rows`` will replay on sequences from ``first`` to ``last`` positions
    (``runners``: role -> ``RunnerConfig``), for each model whose runner is the step; with ``head`` (a
    row drafts with it), the target's graphs also return its layers' hidden states and the head's own
    draft step is built too (``eagle.head_step``). On CPU, each model's C step scratch grown to those passes
    (``reserve_scratch``), outside the seconds returned. Returns the seconds spent."""
    import time

    from runners import prepare_step

    seconds, layers = 0.0, tuple(head.config.aux_layers) if head is not None else ()
    for role, model, widths in (("target", target, step_widths(rows)), ("drafter", drafter, drafter_widths(rows))):
        if model is not None and widths:
            reserve_scratch(model, max(widths), last)
        if model is None or not widths or not runners[role].step_for(model):
            continue
        seconds += prepare_step(model, last, lambda text: say(f"{role}: {text} ..."), layers if role == "target" else (),
                                widths=widths, first=first, graphs=runners[role].graphs)
    reserve_head_scratch(head, max(head_widths(rows), default=1), last)
    if head is not None and runners["target"].step_for(target):
        from eagle.head_step import prepare_head_step

        clock = time.perf_counter()
        if prepare_head_step(head, first, last, lambda text: say(f"head: {text} ..."), head_widths(rows)):
            seconds += time.perf_counter() - clock
    return seconds


def reserve_scratch(model, widest: int, last: int) -> None:
    """The scratch of ``model``'s C step (CPU; where one is kept) grown, before a timed run, to what a run ending by
    ``last`` positions needs: its prompt (in chunks) and passes of up to ``widest`` positions over the largest cache
    such a run grows (``runners.static.grown_capacity``: a first reserve, then doubling; bounded by twice the first's
    for ``last`` plus ``widest``), so that no timed pass grows it (a one-time allocation and its pages:
    ``kernels.once``'s "scratch"). Nothing where the model runs no C step."""
    from kernels.kept_steps import kept_step

    step = kept_step(model)
    if step is None or not hasattr(step, "scratch"):
        return
    from kernels.c_step import CHUNK_ROWS, plan_of
    from kernels.step_scratch import reserve
    from runners.static import grown_capacity

    reserve(step, max(widest, last), 2 * grown_capacity(last + widest, 0), plan_of(model).chunk or CHUNK_ROWS)


def reserve_head_scratch(head, widest: int, last: int) -> None:
    """The C head step's scratch (where the warm-up made one) grown, before a timed run, to a run ending by ``last``
    positions: its first step feeds the whole prompt, and its cache (``drafters.eagle``: at least 256 slots, twice the
    prompt, then doubling) stays under twice ``last`` plus ``widest``. Nothing where the head drafts on its torch step."""
    step = head.kept_c_step() if head is not None else None
    if step is not None:
        step.reserve(last, max(256, 2 * (last + widest)))


AUTO_GAMMA = 8  # the widths built at start-up for gamma "auto": its drafts are chosen by the costs measured up to 12 rows


def start_widths(gammas: Iterable) -> Tuple[int, ...]:
    """The target's widths built at start-up: 1, and each ``gamma`` (a number, or "auto") plus one, for the
    verification costs the start-up measures and the chain rows' first comparison."""
    return tuple(sorted({1} | {1 + (AUTO_GAMMA if g == "auto" else int(g)) for g in gammas}))


def head_layers(path) -> Tuple[int, ...]:
    """The target layers a head folder reads (speculators' ``eagle_aux_hidden_state_layer_ids``), read
    before loading so that the start-up graphs return them; () where the folder does not say (its
    graphs are then built again with them, once, when the head loads)."""
    import json
    from pathlib import Path

    try:
        config = json.loads((Path(path) / "config.json").read_text()) if path else {}
        return tuple(int(k) for k in config.get("eagle_aux_hidden_state_layer_ids") or ()) \
            if config.get("speculators_model_type") == "eagle3" else ()
    except (OSError, ValueError, TypeError):
        return ()
