"""A soak (issue 70): in one process, 20 rounds of loading the embedded model, running each path a user
takes (the REPL's comparison, the benchmark's runs, a notebook's public functions, and each CPU route
of ``set_prepack``) and dropping everything. Resident memory after each round stays within 10% of the
first round's: state kept beside a model (prepacked layers, blocked copies, pools, observers) goes
with it. The rounds run in a subprocess of their own (the suite's memory does not count), a few
tokens per path; the child prints one JSON line per round with the resident memory after each path."""
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROUNDS = 20
TOLERANCE = 0.10
PATHS = ("repl", "bench", "notebook")
# the notebook's load, autoregressive_generate and each CPU route run every round; the REPL's and the
# benchmark's paths (two more loads of the pair, seconds each) and speculative_generate on rounds 1,
# 6, 11, 16 and 20: a path that leaks anything model-sized still grows the memory by 4 times that,
# and the soak costs a third of what it would
EVERY_ROUND = ("notebook",)
WHOLE_EVERY = 5
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


def child(rounds: int, paths) -> None:
    """``rounds`` rounds of ``paths``: one JSON line each, the resident memory (MiB) after each path or
    route (everything it made dropped and collected) and the seconds since the previous mark. Stops
    after the first round past the tolerance: a leak of a model a round must not fill the machine."""
    import torch

    torch.set_num_threads(1)
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


@pytest.mark.needs_cc  # the skinny route runs the C kernels
def test_twenty_rounds_of_every_users_path_hold_resident_memory_flat():
    found = rounds_of(PATHS)
    first = found[0]["dropped"]  # the round's end: everything it made dropped
    grown = [(i + 1, row["dropped"]) for i, row in enumerate(found) if row["dropped"] > first * (1 + TOLERANCE)]
    assert not grown, f"resident memory after a round grew past {first * (1 + TOLERANCE):.0f} MiB:\n{table(found)}"
    assert len(found) == ROUNDS, table(found)


if __name__ == "__main__":
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    os.chdir(ROOT)
    child(int(sys.argv[1]), sys.argv[2].split(","))
