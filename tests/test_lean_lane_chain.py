"""The lean runner's decided pass over a chain of 2..12 positions (``runners.lean_lane``, a drafting row's
verification pass): the full pass's bits (logits, each row's kept top, the cache it writes, a head's hidden
states), float32 and bfloat16; never stale: each change that sends a one-position pass back to the full pass
(a hook registered, a layer swapped, a cast, a step let go, a route that runs the width elsewhere) sends a
chain pass back too, with the full pass's result; and greedy drafting rows emit target AR's tokens with the lane
on and off, their verification passes on it. Tiny Llamas, as ``tests/test_lean_lane.py``'s."""
import pytest
import torch

import runners.lean_lane as lean_lane
from conftest import EOS_NEVER, PROMPT, VOCAB, llama
from drafters import PromptLookupSpec
from kernels import skinny
from ngram_assisted import NGramStorage, ngram_assisted_speculative_generate
from runners import LeanRunner
from sampling import autoregressive_generate, generate, speculative_generate
from test_lean_lane import IDS, MODELS
from utils.logits_processor import row_tops
from utils.models import truncated_drafter

pytestmark = pytest.mark.skipif(not skinny.available()[0], reason="the lane runs the C step")
WIDTHS = list(range(2, 13))  # a verification pass's positions: 1 + up to 11 drafts


def verify(runner: LeanRunner, widths: list, between=None) -> list:
    """Chain decoding's passes (``sampling.chain_decoding``) after ``PROMPT`` and one decoding pass, from an empty cache:
    pass ``i`` feeds the last token and ``widths[i] - 1`` drafts of its own (fixed, by position), asks every row,
    keeps ``i % widths[i]`` drafts and the target's next token (rolled back as the loop rolls back);
    ``between(i)`` before pass ``i``. Each pass's (logits, the rows' kept tops)."""
    runner.rollback(0)
    tokens = PROMPT + [int(runner(IDS, 1)[0].argmax())]
    runner(torch.tensor([tokens]), 1)  # a decoding pass: the lane recorded on every model
    tokens.append(0)
    runner.rollback(len(tokens) - 1)
    out = []
    for i, width in enumerate(widths):
        if between is not None:
            between(i)
        cur = len(tokens)
        drafts = [(7 * (cur + j) + i) % VOCAB for j in range(width - 1)]
        logits = runner(torch.tensor([tokens + drafts]), width)
        tops = row_tops(logits)
        out.append((logits.clone(), None if tops is None else list(tops)))
        kept = i % width
        tokens += drafts[:kept] + [int(logits[kept].argmax())]
        runner.rollback(cur + kept)
    return out


def run_both(make, widths: list, event=None, at: int = 3, layers: tuple = ()):
    """``verify`` with the lane on and off, each on its own copy of the model, ``event(model, runner)`` before pass
    ``at``: (passes on, passes off, the runner with the lane on, its lane's passes before and after pass ``at``)."""
    found = {}
    for on in (True, False):
        lean_lane.ON = on
        model, marks = make(), {}
        runner = LeanRunner(model)
        runner.hidden_layers = layers
        hidden = []

        def between(i, model=model, runner=runner, marks=marks, hidden=hidden):
            hidden.append(None if runner.hidden is None else runner.hidden.clone())
            marks[i] = runner.lane.passes
            if i == at and event is not None:
                event(model, runner)
        try:
            passes = verify(runner, widths, between)
        finally:
            lean_lane.ON = True
        hidden = hidden[1:] + [None if runner.hidden is None else runner.hidden.clone()]  # each pass's, read before the next
        found[on] = (passes, hidden, runner, marks)
    return found[True], found[False]


def same(a: list, b: list) -> bool:
    """Every pass's logits equal bit for bit, and the tops kept on them too."""
    return len(a) == len(b) and all(torch.equal(x, y) and tx == ty for (x, tx), (y, ty) in zip(a, b))


@pytest.mark.parametrize("name", MODELS)
def test_chain_passes_of_2_to_12_positions_give_the_full_passs_bits_and_cache(name):
    (on, _, runner, _), (off, _, runner_off, _) = run_both(MODELS[name], WIDTHS)
    assert same(on, off) and all(tops is not None and len(tops) == len(x) for x, tops in on)
    assert runner.lane.passes >= len(WIDTHS) and runner_off.lane.passes == 0  # every verification pass on the lane
    end = runner.cached
    assert end == runner_off.cached and all(
        torch.equal(a.keys[:, :, :end], b.keys[:, :, :end]) and torch.equal(a.values[:, :, :end], b.values[:, :, :end])
        for a, b in zip(runner.cache.layers, runner_off.cache.layers))


@pytest.mark.parametrize("name", MODELS)
def test_a_drafters_cut_rows_ride_the_lane_with_the_full_passs_bits(name):
    """A drafter's output layer cut to its first 32 ids and its fed tokens' (``kernels.head_rows``): its one-position
    and chain passes take the lane and give the full pass's logits bit for bit (minus infinity past the rows, a
    fed token's row joining on the lane as on the full pass: the drafts run over the whole vocabulary) and cache."""
    found = {}
    for on in (True, False):
        lean_lane.ON = on
        runner = LeanRunner(MODELS[name]())
        assert runner.output_rows(32) == 32
        try:
            found[on] = (verify(runner, [1, 1] + WIDTHS), runner)
        finally:
            lean_lane.ON = True
    (on, runner), (off, runner_off) = found[True], found[False]
    assert same(on, off) and runner.lane.passes >= len(WIDTHS) + 2 and runner_off.lane.passes == 0
    assert all(not torch.isfinite(x).all() for x, _ in on)  # the cut: some ids never computed
    end = runner.cached
    assert all(torch.equal(a.keys[:, :, :end], b.keys[:, :, :end]) for a, b in zip(runner.cache.layers, runner_off.cache.layers))


@pytest.mark.parametrize("cut", [0, 32], ids=["every row", "a drafter's 32 rows"])
@pytest.mark.parametrize("name", ["tied float32", "untied bfloat16"])
def test_a_positions_logits_do_not_depend_on_the_lanes_width(name, cut):
    """Row invariance through the lane: a position's logits in a 6-position pass equal those of its one-position pass
    (a drafter's cut rows too: the tokens of both are fed before either is compared)."""
    runner = LeanRunner(MODELS[name]())
    runner.output_rows(cut)
    ids = torch.tensor([PROMPT + [3, 14, 15, 92 % VOCAB, 65, 35]])
    runner(ids[:, : len(PROMPT) + 1], 1)
    runner(ids[:, : len(PROMPT) + 2], 1)  # recorded
    runner.rollback(len(PROMPT))
    passes = runner.lane.passes
    wide = runner(ids, 6).clone()
    runner.rollback(len(PROMPT))
    ones = [runner(ids[:, : len(PROMPT) + k], 1)[0].clone() for k in range(1, 7)]
    assert runner.lane.passes == passes + 7 and all(torch.equal(wide[k], ones[k]) for k in range(6))


@pytest.mark.parametrize("name", ["tied float32", "untied bfloat16"])
def test_a_heads_hidden_states_ride_the_chain_lane_with_the_full_passs_bits(name):
    (on, hidden, runner, _), (off, hidden_off, _, _) = run_both(MODELS[name], WIDTHS, layers=(0, 1))
    assert same(on, off) and runner.lane.passes >= len(WIDTHS)
    assert all(torch.equal(a, b) for a, b in zip(hidden, hidden_off))
    assert [h.shape for h in hidden] == [(w, 2 * 32) for w in WIDTHS]


def _hook(model, runner):
    model.model.layers[1].mlp.register_forward_hook(lambda module, args, output: None)


def _swap(model, runner):  # a measurement's next option: every linear swapped (``set_prepack`` counts it), on the step again
    from kernels.prepacking import SKINNY, set_prepack
    set_prepack(model, True, (SKINNY,))


def _cast(model, runner):  # a bfloat16 model's step reads float32 weights again: remade
    model.to(torch.float32)


HELD: list = []  # a step let go but kept alive elsewhere (the pool's other runner): the lane must not run it


def _let_go(model, runner):  # a kernel measurement switching away (``kernels.holding.drop_step``)
    from kernels.holding import drop_step
    HELD.append(runner.step)
    drop_step(runner)


def _route(model, runner):  # the plan runs this width (5) on the torch forward, one position still on the step
    from kernels.prepacking import OWN, SKINNY, PrepackedLinear
    from utils.module_walk import first_module
    first_module(model, PrepackedLinear).route = (SKINNY, SKINNY, SKINNY, SKINNY, OWN) + (SKINNY,) * 7


EVENTS = {"hook": _hook, "swap": _swap, "cast": _cast, "let go": _let_go, "route": _route}


@pytest.mark.parametrize("event", EVENTS)
def test_a_change_sends_the_next_chain_pass_to_the_full_pass_with_its_result(event):
    widths = [4, 3, 6, 5, 4, 2, 5]  # the change before the pass of 5 positions (``at`` 3)
    make = MODELS["tied bfloat16"] if event == "cast" else MODELS["untied float32"]
    (on, _, runner, marks), (off, _, _, _) = run_both(make, widths, EVENTS[event])
    HELD.clear()
    assert same(on, off)
    assert marks[2] == marks[1] + 1 and marks[3] == marks[2] + 1  # on the lane before the change
    assert marks[4] == marks[3]  # the pass after it: in full
    if event == "hook":  # transformers' forward from then on, every hook firing
        assert runner.hooked_passes == len(widths) - 3 and runner.lane.passes == marks[3]
    elif event == "route":  # decided again by the next full pass (4 positions); then 2 on the lane, 5 never
        assert marks[5] == marks[4] == marks[3] and runner.lane.passes == marks[6] == marks[5] + 1
    else:  # decided again by the full pass, then on the lane again
        assert runner.lane.passes == marks[3] + 3


def test_a_chain_past_the_rope_rows_a_regrown_cache_left_runs_on_rows_grown_for_it():
    """The cache regrown between passes (``_reserve``: its RoPE table keeps the old capacity's rows), a long pass up to
    two slots before the old capacity, then a 6-position chain across it: the lane grows the table to the chain's
    end (``RopeTable.row``'s ``count``), the full pass's bits."""
    found = {}
    for on in (True, False):
        lean_lane.ON = on
        try:
            runner = LeanRunner(MODELS["untied float32"]())
            runner(IDS, 1)
            old = runner.capacity
            ids = torch.tensor([[(5 * i + 3) % VOCAB for i in range(old + 4)]])
            runner(ids[:, : len(PROMPT) + 1], 1)
            runner._reserve(old + 1)
            runner(ids[:, : old - 2], 1)  # within the table's rows: not grown
            passes = runner.lane.passes
            found[on] = (runner(ids, 6).clone(), runner.lane.passes - passes, runner.ropes.length)
        finally:
            lean_lane.ON = True
    (logits, passes, rows), (logits_off, passes_off, _) = found[True], found[False]
    assert torch.equal(logits, logits_off) and (passes, passes_off) == (1, 0) and rows >= logits.shape[0] + old - 2


def test_greedy_drafting_rows_emit_target_ar_tokens_with_their_verification_on_the_lane():
    """Prompt lookup, NASD and a drafter model, greedy, lane on and off: target AR's tokens, and with it on, most of
    the target's passes of 2..12 positions run the lane (counted by width, ``Lane.run``'s answer)."""
    target = llama(layers=3).to(torch.float32)
    drafter = truncated_drafter(target, 1)
    run = lean_lane.Lane.run
    widths = {True: [], False: []}

    def counting(self, runner, ids, start, rows=1, asked=1):
        logits = run(self, runner, ids, start, rows, asked)
        if runner.model is target:
            widths[logits is not None].append(rows)
        return logits

    reference = autoregressive_generate(PROMPT, target, 40, eos_tokens_id=EOS_NEVER, use_cache=True)
    rows = {}
    lean_lane.Lane.run = counting
    try:
        for on in (True, False):
            lean_lane.ON = on
            widths[True].clear(), widths[False].clear()
            out, _ = speculative_generate(PROMPT, drafter, target, gamma=4, max_gen_len=40, eos_tokens_id=EOS_NEVER, use_cache=True)
            nasd, _ = ngram_assisted_speculative_generate(PROMPT, NGramStorage(2, VOCAB), target, gamma=4, max_gen_len=40,
                                                          eos_tokens_id=EOS_NEVER, use_cache=True)
            pld, _ = generate(PROMPT, target, PromptLookupSpec(), dict(max_gen_len=40, eos_tokens_id=EOS_NEVER, use_cache=True))
            assert out == reference and nasd == reference and pld == reference
            rows[on] = ([w for w in widths[True] if w > 1], [w for w in widths[False] if w > 1])
    finally:
        lean_lane.Lane.run, lean_lane.ON = run, True
    (lane, full), (lane_off, _) = rows[True], rows[False]
    assert len(lane) > 10 and len(lane) > 4 * len(full) and lane_off == []
