"""A drafter's output layer cut to part of its rows (``kernels.head_rows``, ``RunnerConfig.drafter_head``; FR-Spec,
arXiv 2502.14856): its C step computes the first N ids' logits and every fed token's, bit for bit those of the whole
layer, minus infinity for the rest; greedy speculative decoding with it emits target AR's tokens; sampled, its
output follows the target's distribution (the drafter's q is zero past its rows, as it drafted); the header
names it where it runs, and the target never computes part of its rows."""
import pytest
import torch

from conftest import llama, perturbed_copy
from drafters.model import drafted_rows_words
from kernels import skinny
from kernels.head_rows import ROOM, HeadRows, kept_rows
from runners import LeanRunner, RunnerConfig
from sampling import autoregressive_generate, speculative_generate
from sampling.config import Observer
from test_lossless_sampling import chi_square_pvalue
from utils.logits_processor import TopKProcessor

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(not skinny.available()[0], reason="the skinny kernel is not built here")]

VOCAB, ROWS = 512, 32  # the drafter's first 32 ids of 512, then the tokens it is fed
PROMPT = [5, 17, 33, 5, 17, 40, 2, 9, 5, 17, 33, 71, 300, 9]  # 33, 40, 71 and 300 lie past the first 32


def pair(dtype: torch.dtype, vocab: int = VOCAB, noise: float = 0.05):
    """A target and a drafter that agrees with it only partly (its weights plus ``noise`` of their spread), on the C step in ``dtype``."""
    target = llama(vocab=vocab, seed=1, init=0.3)
    return target.to(dtype), perturbed_copy(target, noise, seed=2).to(dtype)


class Proposed(Observer):
    """Every draft a generation verified, and the tokens before it (what the drafter had been fed)."""

    def __init__(self):
        self.steps = []

    def on_step(self, step) -> None:
        self.steps.append((list(step.tokens[: step.start]), list(step.proposed)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_part_rows_are_the_whole_layers_bit_for_bit_and_minus_infinity_elsewhere(dtype):
    """The rows computed: ids 0..31, the prompt's, the model's end tokens; their logits those of the whole
    layer's pass exactly (one slice of the same blocks, the same kernel); the rest minus infinity."""
    _, drafter = pair(dtype)
    whole, part = LeanRunner(drafter), LeanRunner(drafter)
    assert part.output_rows(ROWS) == ROWS
    ids = torch.tensor([PROMPT])
    full, cut = whole(ids, 1)[0], part(ids, 1)[0]
    ends = {int(drafter.config.eos_token_id)} if drafter.config.eos_token_id is not None else set()
    rows = set(range(ROWS)) | set(PROMPT) | ends
    assert set(torch.isfinite(cut).nonzero().flatten().tolist()) == rows
    kept = sorted(rows)
    assert torch.equal(cut[kept], full[kept])
    more = torch.tensor([PROMPT + [450, 451]])  # two more tokens fed: their rows join
    cut, full = part(more, 2), whole(more, 2)
    assert torch.isfinite(cut[:, [450, 451]]).all() and torch.equal(cut[:, kept + [450, 451]], full[:, kept + [450, 451]])


def test_a_second_pass_of_the_same_width_allocates_no_new_full_width_logits():
    """A drafter's pass spreads its rows' logits over the vocabulary in a buffer its runner reuses: the second
    pass of a width writes the first's memory, and torch's allocator sees no block of ``[n, V]`` made during it
    (the cut's point is a cheap pass); its logits are still those of a fresh runner, bit for bit."""
    from utils.allocations import counted

    _, drafter = pair(torch.float32)
    runner, fresh = LeanRunner(drafter), LeanRunner(drafter)
    runner.output_rows(ROWS)
    n, ids = 3, torch.tensor([PROMPT + [450, 451, 452]])
    first = runner(ids, n)
    address = first.data_ptr()
    runner.rollback(len(PROMPT))
    with counted() as held:
        second = runner(ids, n)
    made = [b - a for (_, a), (_, b) in zip([(0, 0)] + held.trace, held.trace)]
    assert second.data_ptr() == address and max(made) < n * VOCAB * second.element_size(), made
    fresh.output_rows(ROWS)
    assert torch.equal(second, fresh(ids, n))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_spread_over_the_vocabulary_on_this_thread_with_the_same_values(dtype):
    """``HeadRows.full`` puts each row's logit at its id and minus infinity elsewhere, over a buffer dirty from an
    earlier pass; float32 logits (the C step's) are spread by numpy, no torch kernel running over ``[n, V]`` (torch's
    fill is an intra-op parallel region: on a busy machine its threads wait for a core), bfloat16 ones by torch, alike."""
    source = torch.randn((VOCAB // 16, 8, 16), generator=torch.Generator().manual_seed(3)).to(dtype)
    rows = HeadRows(source, VOCAB, ROWS)
    rows.add([300, 40, 450])  # past the first 32: spread by index
    logits = torch.randn((2, rows.rows), generator=torch.Generator().manual_seed(4)).to(dtype)
    expected = torch.full((2, VOCAB), float("-inf"), dtype=dtype)
    expected[:, rows.ids[: rows.length]] = logits[:, : rows.length]
    out = torch.randn((2, VOCAB)).to(dtype)  # a reused buffer: the last pass's values in every lane
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as seen:
        spread = rows.full(logits, out)
    assert spread.data_ptr() == out.data_ptr() and torch.equal(spread, expected)
    kernels = [e.name for e in seen.events() if any(word in e.name for word in ("fill", "copy", "index"))]
    assert (kernels == []) == (dtype == torch.float32), kernels


def test_tokens_fed_on_the_torch_forward_join_the_rows_too():
    """A pass the torch forward runs (every row, its plan not the skinny kernel's) still feeds its tokens to the rows."""
    from runners import kernels

    _, drafter = pair(torch.float32)
    runner = LeanRunner(drafter)
    runner.output_rows(ROWS)
    with kernels(drafter, False):
        assert torch.isfinite(runner(torch.tensor([PROMPT]), 1)).all()  # the torch forward: every row
    cut = runner(torch.tensor([PROMPT + [1]]), 1)[0]
    assert runner.step_passes == 1 and torch.isfinite(cut[[33, 40, 71, 300]]).all() and not torch.isfinite(cut[450])


def test_rows_hand_over_between_runners_and_keep_to_their_room():
    """One copy per model and count: a second runner takes the added rows over (the first's go); past ``ROOM`` none join."""
    _, drafter = pair(torch.float32, vocab=ROWS + ROOM + 64)
    first, second = LeanRunner(drafter), LeanRunner(drafter)
    first.output_rows(ROWS), second.output_rows(ROWS)
    first(torch.tensor([[ROWS + 5, 1]]), 1)
    rows = kept_rows(first.step.head, first.step.vocab, ROWS)
    assert rows.owned_by(first) and rows.held[ROWS + 5]
    second(torch.tensor([[ROWS + 9, 1]]), 1)
    assert rows.owned_by(second) and rows.held[ROWS + 9] and not rows.held[ROWS + 5]
    other = kept_rows(first.step.head, first.step.vocab, 2 * ROWS)  # another count: its own copy, beside (an A/B alternates them)
    assert other is not rows and kept_rows(first.step.head, first.step.vocab, ROWS) is rows
    rows.add(range(ROWS, ROWS + ROOM + 64))
    assert rows.length == rows.capacity == ROWS + ROOM and rows.rows % 16 == 0


def test_rows_made_in_inference_mode_take_tokens_after_it_and_go_with_their_model():
    """Made inside ``torch.inference_mode`` (a notebook's first generate), the rows still take a token in place
    outside it; kept per model's output layer, they hold no reference that keeps that layer alive."""
    import gc
    import weakref

    _, drafter = pair(torch.float32)
    runner = LeanRunner(drafter)
    with torch.inference_mode():
        runner.output_rows(ROWS)
        runner(torch.tensor([PROMPT]), 1)
    assert torch.isfinite(runner(torch.tensor([PROMPT + [450]]), 1)[0, 450])
    head = weakref.ref(runner.step.head)
    del runner, drafter
    gc.collect()
    assert head() is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_speculative_with_part_rows_emits_target_ar_tokens(dtype):
    """Greedy speculative decoding with the drafter's part rows emits target AR's tokens; every draft lies in
    the drafter's rows then (the first 256 ids, or a token fed to it), while the whole layer drafts past them."""
    target, drafter, rows = *pair(dtype), VOCAB // 2
    ref = autoregressive_generate(PROMPT, target, 40, eos_tokens_id=[], use_cache=True, runner=RunnerConfig())
    seen = {}
    for head in (rows, 0):
        seen[head] = Proposed()
        out, rate = speculative_generate(PROMPT, drafter, target, gamma=4, max_gen_len=40, eos_tokens_id=[], use_cache=True,
                                         runner=RunnerConfig(), drafter_runner=RunnerConfig(drafter_head=head), streamer=seen[head])
        assert out == ref and rate > 0
    outside = [d for before, drafts in seen[0].steps for i, d in enumerate(drafts) if d >= rows and d not in before + drafts[:i]]
    assert outside, "the whole layer drafts past the first rows: the cut is what keeps them out"
    for before, drafts in seen[rows].steps:
        assert all(d < rows or d in before for d in drafts), (before, drafts)


SAMPLED_VOCAB, LENGTH, RUNS = 32, 3, 625
SAMPLED_PROMPT = [1, 5, 9, 3, 12]  # all within the first 16 rows: ids 16..31 join only when output


@torch.no_grad()
def exact_distribution(model, processor, prompt, length) -> dict:
    """Probability of every continuation of ``length`` tokens, by enumeration (transformers' forward)."""
    probs = {(): 1.0}
    for _ in range(length):
        grown = {}
        for prefix, mass in probs.items():
            p = processor(model(torch.tensor([prompt + list(prefix)])).logits[0, -1].double()).tolist()
            grown.update({prefix + (t,): mass * pt for t, pt in enumerate(p) if pt > 0})
        probs = grown
    return probs


@pytest.fixture(scope="module")
def sampled_pair():
    return pair(torch.float32, vocab=SAMPLED_VOCAB)


def sampled(target, drafter, skip: bool) -> list:
    processor = TopKProcessor(1.0, 4)
    torch.manual_seed(1234)
    return [tuple(speculative_generate(
        SAMPLED_PROMPT, drafter, target, gamma=2, logits_processor=processor, max_gen_len=LENGTH, eos_tokens_id=[],
        use_cache=True, first_target=False, skip_sample_adjustment=skip, runner=RunnerConfig(),
        drafter_runner=RunnerConfig(drafter_head=16))[0]) for _ in range(RUNS)]


def test_sampled_speculative_with_part_rows_follows_the_target(sampled_pair):
    """Chi-square against the target's exact distribution (top-4 sampling) with the drafter cut to 16 of 32 rows:
    the target puts a good share of its mass on tokens the drafter cannot draft (q zero there), which only the
    residual of the rejections gives."""
    target, drafter = sampled_pair
    probs = exact_distribution(target, TopKProcessor(1.0, 4), SAMPLED_PROMPT, LENGTH)
    assert sum(p for cell, p in probs.items() if max(cell) >= 16) > 0.3
    assert chi_square_pvalue(sampled(target, drafter, skip=False), probs) > 1e-3


def test_the_sampled_test_sees_a_biased_sampler(sampled_pair):
    """Its power: without the residual (``skip_sample_adjustment``) the same run fails it."""
    target, drafter = sampled_pair
    probs = exact_distribution(target, TopKProcessor(1.0, 4), SAMPLED_PROMPT, LENGTH)
    assert chi_square_pvalue(sampled(target, drafter, skip=True), probs) < 1e-6


def test_header_names_the_rows_where_the_c_step_runs_them_only():
    """The header's words where the drafter's passes compute part of the rows, none where they compute all."""
    _, drafter = pair(torch.bfloat16)
    assert drafted_rows_words(drafter, RunnerConfig(), ROWS) == "drafter head: 32 of 512 tokens (the most frequent, and the prompt's and output's)"
    assert drafted_rows_words(drafter, RunnerConfig(), 0) == ""
    assert drafted_rows_words(drafter, RunnerConfig(), VOCAB) == ""
    assert drafted_rows_words(drafter, RunnerConfig(forward="transformers"), ROWS) == ""
    assert drafted_rows_words(drafter.double(), RunnerConfig(), ROWS) == ""


def test_a_target_computes_every_row_whatever_its_config_says():
    """``drafter_head`` is a drafter's: a target's runner made with it still computes every row."""
    target, _ = pair(torch.float32)
    ids = torch.tensor([PROMPT])
    from sampling.config import GenerationConfig

    config = GenerationConfig(use_cache=True, runner=RunnerConfig(drafter_head=ROWS), drafter_runner=RunnerConfig(drafter_head=ROWS))
    assert torch.isfinite(config.make_runner(target)(ids, 1)).all()


def test_the_repl_names_the_drafters_rows_and_keeps_target_ar_tokens(tiny_models):
    """``--drafter-head 4096``: the Drafter line names the rows, and the speculative row is exact (the REPL checks
    every greedy row against target AR: no divergence); ``full``, and ``auto`` on a 49,152-token vocabulary (not
    over twice auto's count), name none."""
    from repl_driver import run_forked

    common = ["--target", tiny_models["target"], "--drafter", tiny_models["drafter"], "--prompt", "Hi there", "--length", "8",
              "--no-calibrate", "--verbose"]
    cut, full, auto = run_forked([[*common, "--drafter-head", "4096"], [*common, "--drafter-head", "full"], common])
    for result in (cut, full, auto):
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        assert "Speculative" in result.stdout and "diverge" not in result.stdout.lower()
    drafter = [next(line for line in r.stdout.splitlines() if line.startswith("Drafter:")) for r in (cut, full, auto)]
    assert "drafter head: 4,096 of 49,152 tokens (the most frequent, and the prompt's and output's)" in drafter[0], drafter[0]
    assert "drafter head" not in drafter[1] and "drafter head" not in drafter[2]


def test_the_runs_value_reaches_the_drafters_runner_only_and_is_written_with_the_run():
    """``RunConfig.drafter_head``: in the drafting runner's config (the rows that draft hand it to the drafter),
    never in the target's or the drafter-alone row's; written and read back with the run."""
    from configuration import RunConfig

    config = RunConfig(drafter_head=ROWS)
    assert config.drafting_runner.drafter_head == ROWS and config.drafter_runner.drafter_head == 0 == config.runner.drafter_head
    assert RunConfig.from_dict(config.to_dict()) == config and RunConfig().drafting_runner is RunConfig().drafter_runner


def test_the_repls_warm_up_makes_the_drafters_rows_and_the_timed_rows_make_none(monkeypatch):
    """The REPL's warm-up (``Repl._warm_up``) makes the drafter's output rows (``kept_rows``), so that the drafting
    row timed first pays for them no more than the others (on the pair: 73 MB zeroed and copied); the speculative
    row then makes none, and its greedy tokens are still target AR's."""
    from transformers import AutoTokenizer

    import infer
    import kernels.head_rows as head_rows
    from configuration import RunConfig, RunContext
    from utils.models import embedded_model_dir

    made = []

    class Counted(head_rows.HeadRows):
        def __init__(self, source, vocab, count):
            made.append(count)
            super().__init__(source, vocab, count)

    monkeypatch.setattr(head_rows, "HeadRows", Counted)
    target = llama(vocab=49152, layers=1, window=4096, init=0.3)
    drafter = perturbed_copy(target, 0.05, seed=2).to(torch.float32)  # the C step's dtype: it runs the cut rows
    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir())
    repl = infer.Repl(RunConfig(max_gen_len=6, drafter_head=ROWS), RunContext(target=target, tokenizer=tokenizer, drafter=drafter),
                      True, 42)
    assert made == [ROWS]
    repl.compare("Hi there, hi there")
    tokens = {strategy.key: result.tokens for strategy, result in repl.last}
    assert made == [ROWS] and tokens["speculative"] == tokens["target"] and len(tokens["target"]) == 6, (made, tokens)
