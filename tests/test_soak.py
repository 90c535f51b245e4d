"""A soak (issue 70): in one process, 7 rounds of loading the embedded model, running each path a user
takes (the REPL's comparison, the benchmark's runs, a notebook's public functions, and each CPU route
of ``set_prepack``) and dropping everything. Resident memory after each round stays within 10% of the
first round's, and its growth from round 2 on (a least-squares slope) stays under what twenty rounds
under that 10% caught (``MAX_SLOPE``): state kept beside a model (prepacked layers, blocked copies, pools,
observers) goes with it. The rounds run in a subprocess of their own (the suite's memory does not count),
a few tokens per path; the child prints one JSON line per round with the resident memory after each path.

Why 7 rounds, not the 20 this soak had (nor the 10 of 2026-11-30): 20 rounds under the 10% bound alone
caught a leak of about ``first * 0.10 / 19`` a round (2.2 MiB of the embedded model's ~415 MiB); the slope
over rounds 2-7 (six points) catches that leak too (its noise: ~0.2 MiB a round, the rounds' growth without
a leak ~0.5-0.9 MiB, measured over 20 rounds on 2026-11-30: 1.3 MiB of margin below the bound either way),
and a leak of a model-sized object a round still fails the 10% bound at round 2.
``test_the_slope_check_fails_on_the_leak_twenty_rounds_caught`` keeps that power asserted."""
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROUNDS = 7
TOLERANCE = 0.10
OLD_ROUNDS = 20  # the rounds the 10% bound alone needed: MAX_SLOPE keeps their power
MAX_SLOPE = TOLERANCE / (OLD_ROUNDS - 1)  # growth a round, as a share of round 1's memory
PATHS = ("repl", "bench", "notebook")
# the notebook's load, autoregressive_generate and each CPU route run every round; the REPL's and the
# benchmark's paths (two more loads of the pair, seconds each) and speculative_generate on rounds 1,
# 4 and 7: a path that leaks L there grows the slope over rounds 2-7 by 0.37 L a round (the ends step up
# L, L, 2L, 2L, 2L, 3L; 0.35 L over rounds 2-10 with 10 rounds): caught from ~3.5 MiB (7.6 MiB with 20
# rounds under the 10% bound alone), a model-sized leak fails the 10% bound at round 4
EVERY_ROUND = ("notebook",)
WHOLE_EVERY = 3
ROOT = Path(__file__).resolve().parents[1]
CHILD = __name__ == "__main__"  # run as the soak's subprocess: ``python tests/test_soak.py ROUNDS PATHS``


def resident_mib() -> float:
    """This process's resident memory (``/proc/self/statm``), after giving freed heap back to the system:
    glibc keeps freed blocks in its arenas, which is no leak and would only add noise."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # not glibc: RSS as it is
        pass
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


# ---- the child: one user path each, everything it made dropped when it returns ----------------------

def _quiet(*args, **kwargs) -> None:
    pass


def _repl() -> None:
    """``infer.py``'s path: ``load_pair`` (the start-up measurements are remembered after round 1), the
    settings, the ``Repl`` (its warm-up) and one comparison of two rows."""
    from app.pair import LoadOptions, load_pair
    from app.repl.repl import Repl
    from app.session import build_settings

    pair = load_pair(None, "layers:4", LoadOptions("cpu", calibrate=False), say=_quiet)
    config, context = build_settings(pair, "greedy", gamma=2, length=2, say=_quiet)
    repl = Repl(config, context, True, 42)
    repl.enabled = {key: key in ("target", "speculative") for key in repl.enabled}
    repl.compare("Hi")


def _bench() -> None:
    """``bench.py``'s path: ``Bench`` (its own ``load_pair`` and settings) and one run of each row on one
    tiny prompt, as the timed runs make them. Without the EAGLE head: its load times its draft step
    (seconds a round); ``eagle.head_step``'s state is another soak's."""
    from app.bench.cli import build_parser
    from app.bench.configs import make_configs
    from app.bench.run import Bench, attempt
    from app.session import encode

    args = build_parser().parse_args(["--device", "cpu", "--head", "none", "--strategies", "target,ngram",
                                      "--gamma", "2", "--max-new-tokens", "2", "--no-calibrate", "--repeats", "1"])
    bench = Bench(args, greedy=True)
    prompt = encode(bench.tokenizer, [{"role": "user", "content": "Hi"}], True)
    for config in make_configs(args, bench.drafter is not None, bench.context.head is not None):
        result = attempt(bench, config, prompt)
        assert not isinstance(result, str), result  # a failed row is a string: the soak must run them


def _notebook(mark, full: bool = True) -> None:
    """A notebook's path: the model as ``load_embedded`` gives it and the public functions on it (with
    ``full``, speculative decoding too: its drafter is a deep copy, a second or two); then each CPU
    route of ``set_prepack`` on it in turn (``mark``: after each, the memory is read)."""
    from runners import set_prepack
    from sampling import autoregressive_generate, speculative_generate
    from utils.models import load_embedded, truncated_drafter

    model, tokenizer = load_embedded()
    prompt = tokenizer("The quick brown fox").input_ids
    common = dict(max_gen_len=2, eos_tokens_id=[-1], use_cache=True)
    autoregressive_generate(prompt, model, **common)
    if full:
        speculative_generate(prompt, truncated_drafter(model, 4), model, gamma=2, **common)
    mark("notebook")
    for route in ROUTES:
        assert set_prepack(model, True, (route,)), f"the {route} route could not be set"
        autoregressive_generate(prompt, model, **common)
        mark(route)


ROUTES = ("skinny", "prepacked", "own")
CHILD_PATHS = {"repl": _repl, "bench": _bench, "notebook": _notebook}


def _given_pass_times() -> None:
    """The start-up's kernel measurement (round 1's, saved and reused by the later loads) with each pass's
    seconds given instead of timed, the skinny kernel fastest (as on this project's CPUs): its switches
    between the options' copies of the weights run as they do, its passes do not. Timing them took a third
    of the soak (the embedded target and its 4-layer drafter at 1 thread) and checks nothing here: round 1
    is the baseline the later rounds are held to, and every later load reuses what it saved. The prompt GEMM's
    variants likewise (``measure.prompt``: their C step is made as it is, their linears are not timed; ~2 s a
    soak, single run, noisy)."""
    from kernels.prepacking import SKINNY, plan
    from measure import prompt, timing

    timing.PassTimer.seconds = lambda self, rows: (0.010 if plan(self.model)[0] == SKINNY else 0.020) + 0.001 * rows
    prompt._Candidate.seconds = lambda self, rows: 0.001 * rows


def child(rounds: int, paths) -> None:
    """``rounds`` rounds of ``paths``: one JSON line each, the resident memory (MiB) after each path or
    route (everything it made dropped and collected) and the seconds since the previous mark. Stops
    after the first round past the tolerance: a leak of a model a round must not fill the machine."""
    import torch

    torch.set_num_threads(1)
    _given_pass_times()
    first = None
    for index in range(rounds):
        after, seconds, start = {}, {}, [time.perf_counter()]

        def mark(name: str) -> None:
            gc.collect()
            after[name], seconds[name] = round(resident_mib(), 1), round(time.perf_counter() - start[0], 2)
            start[0] = time.perf_counter()

        full = index % WHOLE_EVERY == 0 or index == rounds - 1
        for name in paths if full else [name for name in paths if name in EVERY_ROUND]:
            if name == "notebook":  # marks the notebook and each route with the model still held
                CHILD_PATHS[name](mark, full)
                mark("dropped")
            else:
                CHILD_PATHS[name]()
                mark(name)
        print(json.dumps({"rss": after, "seconds": seconds}), flush=True)
        end = after[list(after)[-1]]
        first = end if first is None else first
        if end > first * (1 + TOLERANCE):
            return


# ---- the test ---------------------------------------------------------------------------------------

def rounds_of(paths, rounds: int = ROUNDS):
    from conftest import MEASUREMENTS_ENV

    env = {**os.environ, **MEASUREMENTS_ENV, "HF_HUB_OFFLINE": "1", "OMP_WAIT_POLICY": "passive", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, __file__, str(rounds), ",".join(paths)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line)["rss"] for line in done.stdout.splitlines() if line.startswith('{"rss"')]


def table(found) -> str:
    return "\n".join(f"round {i + 1:2d}: " + ", ".join(f"{name} {mib:.0f} MiB" for name, mib in row.items())
                     for i, row in enumerate(found))


def slope(values) -> float:
    """The least-squares slope of ``values`` (MiB) over their index: MiB a round."""
    count = len(values)
    middle, mean = (count - 1) / 2, sum(values) / count
    return sum((i - middle) * (v - mean) for i, v in enumerate(values)) / sum((i - middle) ** 2 for i in range(count))


def flatness_problem(ends) -> str:
    """Why the rounds' end memory (MiB, round 1 first) is not flat, or "": a round past round 1's + 10%,
    or a slope from round 2 on above ``MAX_SLOPE`` of round 1's (round 1 also holds the first-time state:
    start-up measurements, tokenizers, torch's own)."""
    first = ends[0]
    grown = [(i + 1, end) for i, end in enumerate(ends) if end > first * (1 + TOLERANCE)]
    if grown:
        return f"resident memory after a round grew past {first * (1 + TOLERANCE):.0f} MiB: {grown}"
    rate = slope(ends[1:])
    if rate > first * MAX_SLOPE:
        return f"resident memory grew {rate:.2f} MiB a round from round 2 on (at most {first * MAX_SLOPE:.2f})"
    return ""


# the rounds' end memory (MiB) of the 20-round soak on 2026-11-30 (the machine busy): ~0.55 MiB a round
MEASURED_ENDS = (413.1, 413.1, 413.2, 414.0, 415.0, 416.3, 417.3, 417.3, 417.4, 418.3)


def test_the_slope_check_fails_on_the_leak_twenty_rounds_caught():
    """The ROUNDS-round check's power, on the first ROUNDS measured rounds: they pass; with the leak that 20
    rounds under the 10% bound caught (``first * 0.10 / 19`` a round), or a full round's leak of 4 MiB (on
    the rounds the child runs every path), they fail it; a model-sized leak fails at its first round."""
    ends = MEASURED_ENDS[:ROUNDS]
    assert flatness_problem(ends) == ""
    leak = ends[0] * TOLERANCE / (OLD_ROUNDS - 1)
    assert "a round from round 2" in flatness_problem([end + leak * i for i, end in enumerate(ends)])
    whole = [index % WHOLE_EVERY == 0 or index == ROUNDS - 1 for index in range(ROUNDS)]  # as ``child`` runs them
    assert "a round from round 2" in flatness_problem([end + 4 * sum(whole[:i + 1]) for i, end in enumerate(ends)])
    assert "grew past" in flatness_problem([*ends[:3], ends[3] + 135, *ends[4:]])


@pytest.mark.needs_cc  # the skinny route runs the C kernels
def test_rounds_of_every_users_path_hold_resident_memory_flat():
    found = rounds_of(PATHS)
    problem = flatness_problem([row["dropped"] for row in found])  # the round's end: everything it made dropped
    assert not problem, f"{problem}\n{table(found)}"
    assert len(found) == ROUNDS, table(found)


if __name__ == "__main__":
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    os.chdir(ROOT)
    child(int(sys.argv[1]), sys.argv[2].split(","))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # the rounds are read: no second of finalizing the modules and models of a Python that loaded them
