"""A drafter's greedy-exactness test in one call (docs/adding-a-drafter.md):

    from drafting import assert_greedy_exact

    def test_greedy_exact():
        assert_greedy_exact(lambda prompt, config: RepeatNgram(2))

runs the drafter through ``sampling.generate`` (the chain loop, or the tree loop with ``trees=True``)
on each tiny random model of ``MODELS`` x KV cache (dynamic, static, none) x draft length
(``gamma``; a tree's node budget with ``trees``) x with and without the generation's first target-only
step (``first_target``: with it the drafter is first asked after one generated token, without it right
after the prompt), and compares each output with greedy target autoregressive on the same runner.
It raises AssertionError naming the first run (model, cache, gamma, first_target) whose output differs
(and where) or that failed, and when the drafter never drafted at all (such a test would prove nothing).
"""
import functools
from typing import Callable, Iterable, Tuple

from conftest import EOS_NEVER, PROMPT, gpt2, llama

# tiny random models whose greedy output on PROMPT varies and repeats itself now and then (gpt2's
# default initialisation repeats one token: every drafter would look exact there), in float64
MODELS = {"llama": lambda: llama(), "gpt2": lambda: gpt2(seed=1, init=0.2)}
CACHES = ("dynamic", "static", "off")  # "off": use_cache=False, every pass feeds the whole sequence


@functools.lru_cache(maxsize=None)
def _model(name: str):
    return MODELS[name]()


def _runner(cache: str) -> dict:
    from runners import RunnerConfig

    return dict(use_cache=cache != "off", runner=RunnerConfig(cache=None if cache == "off" else cache))


@functools.lru_cache(maxsize=None)
def _expected(name: str, cache: str, prompt: Tuple[int, ...], length: int) -> Tuple[int, ...]:
    from sampling import autoregressive_generate

    return tuple(autoregressive_generate(list(prompt), _model(name), max_gen_len=length, eos_tokens_id=EOS_NEVER, **_runner(cache)))


def assert_greedy_exact(make_drafter: Callable, trees: bool = False, models: Iterable[str] = tuple(MODELS),
                        caches: Iterable[str] = CACHES, gammas: Iterable[int] = (1, 2, 4),
                        first_target: Iterable[bool] = (True, False), prompt=PROMPT, length: int = 24) -> Tuple[int, int]:
    """Greedy output with ``make_drafter(prompt, config)``'s drafter equals greedy target AR on every
    combination; returns (drafted, accepted) over all runs. ``make_drafter`` is called once per run
    (``sampling.generate``'s form): a drafter keeps state, so each run gets a fresh one."""
    from drafters.base import Drafter
    from sampling import GenerationStats, generate

    if isinstance(make_drafter, Drafter) or not callable(make_drafter):
        raise TypeError("give make_drafter(prompt, config) returning a fresh drafter, not a drafter")
    drafted = accepted = 0
    for name in models:
        for cache in caches:
            expected = list(_expected(name, cache, tuple(prompt), length))
            for gamma in gammas:
                for first in first_target:
                    stats = GenerationStats()
                    arguments = dict(max_gen_len=length, eos_tokens_id=EOS_NEVER, first_target=first, stats=stats, trees=trees,
                                     gamma=gamma, **_runner(cache))
                    run = f"{name}, cache {cache}, gamma {gamma}, first_target {first}"
                    try:
                        out, rate = generate(list(prompt), _model(name), make_drafter, arguments)
                    except Exception as error:  # a loop the drafter broke may fail before it diverges
                        raise AssertionError(f"{run}: the generation failed: {type(error).__name__}: {error}") from error
                    if out != expected:
                        at = next((i for i, (a, b) in enumerate(zip(out, expected)) if a != b), min(len(out), len(expected)))
                        got, want = (out[at] if at < len(out) else "the end"), (expected[at] if at < len(expected) else "the end")
                        raise AssertionError(f"{run}: new token {at} is {got}, target AR's is {want} "
                                             f"(drafted {stats.drafted}, accepted {stats.accepted})")
                    assert 0.0 <= rate <= 1.0 and stats.accepted <= stats.drafted, (run, rate, stats.accepted, stats.drafted)
                    drafted, accepted = drafted + stats.drafted, accepted + stats.accepted
    assert drafted > 0, "the drafter never drafted on these prompts and models: its exactness test proves nothing"
    return drafted, accepted
