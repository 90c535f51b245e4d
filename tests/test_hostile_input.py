"""The REPL and its flags under careless and hostile input: every refusal is one line, changes no
setting, and nothing typed can make a setting unbounded or non-finite.

The command handler is driven in-process (``Repl.handle``) with generated commands and values;
the flags and the start-up through a subprocess (the refused start-ups forked from one); the terminal
through a pseudo-terminal.
"""
import dataclasses
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import infer
from conftest import MEASUREMENTS_ENV, examples
from utils.parsing import LIMITS, MAX_LINE, decode_bytes, parse_int, parse_limited, sanitize_text

ROOT = Path(__file__).resolve().parents[1]

# values a user may type where a number is expected: huge, non-finite, other notations and scripts
NUMBERISH = st.one_of(
    st.integers(min_value=-(10**40), max_value=10**40).map(str),
    st.integers(min_value=-3, max_value=300).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.floats(min_value=-2, max_value=2).map(str),
    st.sampled_from(["nan", "NaN", "inf", "-inf", "Infinity", "1e999", "-1e999", "1e-999", "1_000", "0x10", "١٢", "²",
                     "1.5", "0.0", "-0", "+7", "1e3", "9" * 5000, "", "--force", "on", "auto", "None", "\udc80", "\x00"]),
    st.text(max_size=8),
)


@given(key=st.sampled_from(sorted(LIMITS)), text=NUMBERISH)
@settings(max_examples=examples(600))
def test_every_numeric_parser_returns_a_finite_value_in_its_range_or_one_line_naming_it(key, text):
    low, high = LIMITS[key]
    try:
        value = parse_limited(text, key)
    except ValueError as error:
        message = str(error)
        assert "\n" not in message and message.startswith(key) and len(message) < 200
        return
    assert isinstance(value, (int, float)) and not isinstance(value, bool)
    assert math.isfinite(value) and low <= value <= high
    assert isinstance(value, float) == isinstance(low, float)


def test_parsers_accept_the_plain_notations():
    assert parse_int(" +7 ", "x", 0, 9) == 7 and parse_limited("0.5", "top_p") == 0.5 and parse_limited("1", "top_p") == 1.0
    assert parse_limited("1e-2", "temperature") == 0.01 and parse_limited("0", "p_min") == 0.0
    for bad in ("0", "1e999", "nan"):
        with pytest.raises(ValueError, match=r"top_p must be"):
            parse_limited(bad, "top_p")
    with pytest.raises(ValueError, match=r"p_min must be in \[0, 1\)"):
        parse_limited("1", "p_min")


@given(st.binary(max_size=64))
@settings(max_examples=examples(300))
def test_bytes_that_are_not_utf8_become_replacement_characters_and_are_counted(data):
    text, replaced = decode_bytes(data)
    text.encode("utf-8")  # strict: what reaches the tokenizer is valid text
    escaped = data.decode("utf-8", "surrogateescape")
    assert replaced == sum("\udc80" <= c <= "\udcff" for c in escaped)  # one per byte that is not UTF-8
    try:
        data.decode("utf-8")
        assert replaced == 0 and text == escaped
    except UnicodeDecodeError:
        assert replaced > 0
    assert sanitize_text(text) == (text, 0)


# ---- the command handler, in-process ----------------------------------------------------------

@pytest.fixture(scope="module")
def repl():
    from transformers import AutoTokenizer

    from conftest import llama
    from strategies import RunConfig, RunContext
    from utils.models import embedded_model_dir

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir())
    target = llama(vocab=49152, layers=1, window=4096)
    return infer.Repl(RunConfig(max_gen_len=2), RunContext(target=target, tokenizer=tokenizer), True, 42)


def snapshot(repl):
    s, x = repl.config, repl.context
    policy = {f.name: getattr(s.policy, f.name) for f in dataclasses.fields(s.policy)}
    return (
        [repl.value_of(name) for name in repl.commands], dict(repl.enabled), repl.chat, repl.stream, repl.reset_in_between,
        repl.storage_kind, repl.storage_n, id(x.storage), id(x.static_storage), s.processor, s.gamma, s.max_gen_len,
        s.param("top_k_filler"), s.param("pld_min_ngram"), s.param("pld_max_ngram"), s.param("pld_num_tokens"), s.use_cache, s.debug,
        policy, s,
    )


def within_limits(repl):
    s, p = repl.config, repl.config.policy
    checks = [("gamma", s.gamma), ("length", s.max_gen_len), ("n", repl.storage_n), ("top_k_filler", s.param("top_k_filler")),
              ("pld_ngram", s.param("pld_min_ngram")), ("pld_ngram", s.param("pld_max_ngram")),
              ("pld_num_tokens", s.param("pld_num_tokens")), ("min_draft", p.min_draft), ("pause_after", p.pause_after),
              ("pause_steps", p.pause_steps), ("p_min", p.p_min), ("min_gain", p.min_gain)]
    checks += [(name, value) for name, value in repl.processor_args.items()]
    for key, value in checks:
        low, high = LIMITS[key]
        assert math.isfinite(value) and low <= value <= high, (key, value)
    assert s.param("pld_min_ngram") <= s.param("pld_max_ngram")


SAFE_COMMANDS = ["/quit", "/help", "/debug", "/speculative", "/ngram", "/target", "/drafter", "/cache", "/chat", "/length",
                 "/gamma", "/processor", "/set_ngramstorage", "/top_k_filler", "/reset_in_between", "/pld", "/pld_params",
                 "/chained", "/adaptive", "/min_draft", "/p_min", "/pause", "/min_gain", "/stats", "/stream", "/frobnicate", "/",
                 "/ngram_load", "/ngram_build"]  # not /ngram_save: it would write files where the test runs
WORD = st.one_of(NUMBERISH, st.sampled_from(["greedy", "multinomial", "topk", "nucleus", "topknucleus", "basic", "onelevel", "trie"]))


@given(name=st.sampled_from(SAFE_COMMANDS), words=st.lists(WORD, max_size=4))
@settings(max_examples=examples(500), suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_command_is_done_or_refused_in_one_line_with_every_setting_unchanged(repl, name, words):
    line = " ".join([name, *words])
    before = snapshot(repl)
    try:
        repl.handle(line)
    except infer.UsageError as error:
        assert "\n" not in str(error).strip() and str(error)
        assert snapshot(repl) == before, line
        return
    except EOFError:
        assert line.split() == ["/quit"], f"{line!r} quit"
        return
    within_limits(repl)


@pytest.mark.parametrize("line", ["/quit now", "/help me", "/clear all", "/stream on", "/stats 3"])
def test_a_stray_argument_is_refused_for_every_command(repl, line):
    before = snapshot(repl)
    with pytest.raises(infer.UsageError, match="takes no argument"):
        repl.handle(line)
    assert snapshot(repl) == before


def test_a_prompt_with_bytes_that_are_not_utf8_reaches_the_tokenizer_as_valid_text(repl, monkeypatch, capsys):
    seen = []
    encode = repl.encode
    monkeypatch.setattr(repl, "encode", lambda text: seen.append(text) or encode(text))
    repl.handle("/length 2")
    text = b"Hello \xff\xfe w\xc3orld".decode("utf-8", "surrogateescape")  # what Python makes of such stdin or argv
    repl.handle(text)
    assert seen == ["Hello \ufffd\ufffd w\ufffdorld"]
    assert "3 bytes that are not UTF-8 were replaced" in capsys.readouterr().out


def test_an_over_long_line_is_refused_before_tokenizing(repl, monkeypatch):
    monkeypatch.setattr(repl, "encode", lambda text: pytest.fail("tokenized"))
    with pytest.raises(infer.UsageError, match=f"at most {MAX_LINE} characters"):
        repl.handle("x" * (MAX_LINE + 1))


# ---- storage files the user points the REPL at -------------------------------------------------

def test_ngram_save_never_replaces_a_users_file_unless_forced(repl, tmp_path):
    mine = tmp_path / "notes.json"
    mine.write_text('{"my": "notes"}')
    with pytest.raises(infer.UsageError, match="not an n-gram storage saved by this tool.*--force"):
        repl.handle(f"/ngram_save {mine}")
    assert mine.read_text() == '{"my": "notes"}'
    with pytest.raises(infer.UsageError, match="not a regular file"):
        repl.handle(f"/ngram_save {tmp_path}")
    repl.handle(f"/ngram_save {mine} --force")
    repl.handle(f"/ngram_save {mine}")  # now a saved storage: replaced without asking
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.json"]  # no temporary file left
    with pytest.raises(infer.UsageError, match="usage: /ngram_save"):
        repl.handle(f"/ngram_save {mine} --forse")


@pytest.mark.parametrize("kind", ["fifo", "folder", "device", "deep", "huge_n", "nul"])
def test_hostile_files_are_refused_at_once_in_one_line(repl, tmp_path, kind):
    path = tmp_path / "s.json"
    if kind == "fifo":
        os.mkfifo(path)  # reading it would wait forever for a writer
    elif kind == "folder":
        path.mkdir()
    elif kind == "device":
        path = Path("/dev/zero")  # endless
    elif kind == "deep":
        path.write_text("[" * 200_000 + "]" * 200_000)
    elif kind == "huge_n":
        path.write_text('{"format": "speculative-decoding/ngram-storage", "version": 1, "kind": "basic", "n": 1000000000, '
                        '"vocab_size": 49152, "tables": {}}')
    else:
        path = f"{tmp_path}/a\x00b"
    before = snapshot(repl)
    for command in ("/ngram_load", "/ngram_build") if kind in ("fifo", "folder", "device", "nul") else ("/ngram_load",):
        # refused without opening it: a read of a FIFO would block forever (a thread, so that the test fails
        # instead of hanging; the wait bounds a hang, it measures no speed)
        outcome = []
        worker = threading.Thread(target=lambda: outcome.append(_refusal(repl, f"{command} {path}")), daemon=True)
        worker.start()
        worker.join(timeout=300)
        assert not worker.is_alive(), f"{command} blocked on a {kind}"
        assert outcome and outcome[0] is not None and "\n" not in outcome[0], outcome
    assert snapshot(repl) == before


def _refusal(repl, line: str):
    """The one-line refusal of ``line`` (None when it was not refused)."""
    try:
        repl.handle(line)
    except infer.UsageError as error:
        return str(error)
    return None


# ---- start-up: flags, prompts and models (a subprocess each) ------------------------------------

def run(*args, stdin: bytes = b"", env=None):
    environment = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HOME": str(Path.home()), **MEASUREMENTS_ENV}
    environment.update(env or {})
    environment = {k: v for k, v in environment.items() if v is not None}
    start = time.monotonic()
    result = subprocess.run([sys.executable, "infer.py", "--device", "cpu", *args], cwd=ROOT, input=stdin, capture_output=True,
                            timeout=300, env=environment)
    return result, time.monotonic() - start


def one_error_line(result):
    out, err = (text.decode() if isinstance(text, bytes) else text for text in (result.stdout, result.stderr))
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert result.returncode == 1 and len(errors) == 1 and not err.strip() and "Traceback" not in out, out + err
    return errors[0]


REFUSED_START_UPS = [
        (["--gamma", "1e999"], "--gamma must be an integer from 1 to 128"),
        (["--gamma", "100000000000000000000"], "--gamma must be >= 1 and <= 128"),
        (["--length", "nan"], "--length must be an integer"),
        (["--seed", "-1"], "--seed must be >= 0"),
        (["--processor", "multinomial inf"], "temperature must be a number in [0.001, 1000]"),
        (["--processor", "topk 1 99999999999999"], "top_k must be >="),
        (["--prompt", "  \\n \\t "], "--prompt is empty"),
        (["--prompt", ""], "--prompt is empty"),
        (["--frobnicate"], "unrecognized arguments"),
        (["--device", "warp9"], "--device must be cpu, cuda, cuda:N, mps or auto"),
        (["--target", "/nonexistent/model"], "no such model folder: /nonexistent/model"),
        (["--target", "infer.py"], "is a file, not a model"),
        (["--target", "someone/not-downloaded-model"], "not in the Hugging Face cache, and HF_HUB_OFFLINE is set"),
]


@pytest.fixture(scope="module")
def refused_start_ups(tiny_models):
    """Each start-up of ``REFUSED_START_UPS`` in a process of its own, forked from one Python that
    imported the libraries once (``repl_driver.run_forked``: 13 imports of torch cost more than the refusals),
    then the tiny target's starts given bytes that are not UTF-8: ``"flag"`` (in ``--prompt``, as Python's argv
    decodes them) and ``"piped"`` (on stdin); forked too, ~4 s of imports each (single run)."""
    from repl_driver import run_forked

    tiny = ["--target", tiny_models["target"], "--no-calibrate", "--length", "2"]
    cases = [args for args, _ in REFUSED_START_UPS] + [[*tiny, "--prompt", b"caf\xe9".decode("utf-8", "surrogateescape")], tiny]
    stdins = [""] * len(REFUSED_START_UPS) + ["", PIPED.decode("utf-8", "surrogateescape")]
    results = run_forked(cases, stdins)
    return {**dict(enumerate(results[:len(REFUSED_START_UPS)])), "flag": results[-2], "piped": results[-1]}


PIPED = b"\n   \n\\n\\t\nHello \xff\xfe there\n/quit now\n/gamma 1e999\n"


@pytest.mark.parametrize("case", range(len(REFUSED_START_UPS)), ids=lambda i: f"args{i}-{REFUSED_START_UPS[i][1]}")
def test_start_up_that_cannot_proceed_says_so_in_one_line_and_exits_non_zero(refused_start_ups, case):
    assert REFUSED_START_UPS[case][1] in one_error_line(refused_start_ups[case])


def test_an_unreachable_hub_fails_fast_in_one_line():
    # no HF_HUB_OFFLINE, and a Hub endpoint where nothing listens: what a machine without network sees
    result, _ = run("--target", "someone/not-downloaded-model", env={"HF_HUB_OFFLINE": None, "HF_ENDPOINT": "http://127.0.0.1:9"})
    assert "the Hub cannot be reached" in one_error_line(result)  # fast: one bounded probe (utils.models._hub_reachable)


def test_a_prompt_flag_with_bytes_that_are_not_utf8_runs_and_says_so(refused_start_ups):
    result = refused_start_ups["flag"]
    out = result.stdout
    assert result.returncode == 0 and "--prompt: 1 byte that is not UTF-8 was replaced" in out and "Target AR" in out, out


def test_piped_bytes_that_are_not_utf8_and_blank_lines_are_handled_and_exit_is_zero(refused_start_ups):
    result = refused_start_ups["piped"]
    out = result.stdout
    assert result.returncode == 0 and "Traceback" not in out + result.stderr, out + result.stderr
    assert "2 bytes that are not UTF-8 were replaced" in out and out.count("Target AR ─") == 1  # only the one real prompt
    assert "/quit takes no argument" in out and "gamma must be an integer" in out and "Goodbye" in out


# ---- a real terminal ---------------------------------------------------------------------------

def test_a_pasted_prompt_longer_than_a_terminal_line_reaches_the_tokenizer_whole(tiny_models):
    """A canonical-mode terminal keeps 4095 characters of a line: the REPL reads it otherwise."""
    import pexpect
    from transformers import AutoTokenizer

    from repl_driver import PROMPT, command, spawn

    tokenizer = AutoTokenizer.from_pretrained(tiny_models["target"])
    child = spawn("--target", tiny_models["target"], "--no-chat", "--no-calibrate", "--length", "1")
    try:
        command(child, "/debug", "debug: on")

        def prompt_reached(sent: str, expected: str):
            child.send(sent)
            child.expect(r"prompt: (\d+) characters, (\d+) tokens")
            counts = int(child.match.group(1)), int(child.match.group(2))
            child.expect(PROMPT)
            assert counts == (len(expected), len(tokenizer(expected).input_ids))

        typed = " ".join(f"w{i}" for i in range(1500)) + " end"  # about 8000 characters on one line
        assert len(typed) > 4096
        prompt_reached(typed + "\r", typed)
        # a paste in bracketed-paste mode keeps its newlines in the one prompt
        pasted = "\n".join(f"line {i} of a pasted paragraph" for i in range(200))
        assert len(pasted) > 4096
        prompt_reached("\x1b[200~" + pasted.replace("\n", "\r") + "\x1b[201~\r", pasted)
        # typed fast, with corrections: Backspace, Ctrl-W (word), arrow keys ignored
        prompt_reached("Hx\x7fi there\x17you\x1b[D\x1b[A!\r", "Hi you!")
        prompt_reached("gone\x15kept\r", "kept")  # Ctrl-U: the whole line
        os.write(child.child_fd, b"caf\xe9 \xff\xfe\r")  # Latin-1 bytes, as pasted from elsewhere
        child.expect("3 bytes that are not UTF-8 were replaced")
        child.expect(r"prompt: 7 characters")
        child.expect(PROMPT)
        os.write(child.child_fd, b"\xe9\r")
        child.expect("1 byte that is not UTF-8 was replaced")
        child.expect(PROMPT)
        child.send("half a line")
        child.sendintr()  # Ctrl-C at the prompt: the line is dropped, the REPL goes on
        child.expect("Ctrl-D or /quit to exit")
        prompt_reached("again\r", "again")
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--gamma", "1,1e999"], "--gamma must be an integer from 1 to 128"),
        (["--ngram-n", "3," + "9" * 50], "--ngram-n must be an integer"),
        (["--top-k-filler", ",".join(["1"] * 100)], "--top-k-filler takes 1 to 64"),
        (["--min-gain", "nan"], "--min-gain must be a number in [0, 1000]"),
        (["--max-new-tokens", "10000000000"], "--max-new-tokens must be >= 1 and <= 1000000"),
        (["--pause", "3"], "--pause takes AFTER,STEPS"),
        (["--pause", "3,0"], "--pause STEPS must be >= 1"),
        (["--seed", "4294967296"], "--seed must be >= 0 and <= 4294967295"),
        (["--repeats", "0"], "--repeats must be >= 1"),
        (["--processor", "topk 1 inf"], "top_k must be an integer"),
    ],
)
def test_bench_flags_share_the_repls_parsers_and_refuse_in_one_line(args, message, capsys):
    import bench

    with pytest.raises(SystemExit) as exit_:
        bench.main(args + ["--out", "/nonexistent/never-written"])
    text = str(exit_.value.code) + capsys.readouterr().err
    assert exit_.value.code != 0 and message in text, text


def test_a_hub_id_in_the_local_cache_loads_offline_and_without_the_hub(tiny_models, tmp_path):
    import shutil

    snapshot_dir = tmp_path / "hub" / "models--someone--tiny" / "snapshots" / "0123abcd"
    shutil.copytree(tiny_models["target"], snapshot_dir)
    (tmp_path / "hub" / "models--someone--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--someone--tiny" / "refs" / "main").write_text("0123abcd")
    cache = {"HF_HUB_CACHE": str(tmp_path / "hub")}
    for env in ({"HF_HUB_OFFLINE": "1"}, {"HF_HUB_OFFLINE": None, "HF_ENDPOINT": "http://127.0.0.1:9"}):
        result, _ = run("--target", "someone/tiny", "--no-calibrate", "--prompt", "Hi", "--length", "2", env={**cache, **env})
        assert result.returncode == 0 and "Target AR" in result.stdout.decode(), result.stdout.decode() + result.stderr.decode()


def test_an_unforeseen_failure_is_one_line_and_the_session_goes_on(repl, monkeypatch, capsys):
    import io

    handle = repl.handle

    def failing(line):
        if line == "boom":
            raise RuntimeError("something deep\nwith a second line")
        handle(line)

    monkeypatch.setattr(repl, "handle", failing)
    monkeypatch.setattr(sys, "stdin", io.StringIO("boom\n/length 7\n" + "x" * (MAX_LINE + 5) + "\n/quit\n"))
    repl.loop()
    out = capsys.readouterr().out
    assert "failed: RuntimeError: something deep (a bug" in out and "second line" not in out
    assert "length: 7" in out and "5 more: nothing done" in out and "Goodbye" in out
