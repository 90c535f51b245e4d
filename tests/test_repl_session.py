"""A session driven as a user would: one REPL on a pseudo-terminal shared by the tests of its commands,
prompts and keys (Ctrl-C, Ctrl-D, /quit), and sessions on a pipe or with --prompt: what each pair of models runs
(the piped sessions forked from one Python, ``repl_driver.run_forked``)."""
import pexpect

import pytest

from conftest import llama, save_tiny
from repl_driver import GIVEN_COSTS, PROMPT, command, run_forked, spawn


@pytest.fixture(scope="module")
def session(tiny_models):
    """The module's one REPL, started again only where a test ended it (/quit, the file's last test)."""
    children = []

    def live():
        if not children or not children[-1].isalive():
            children.append(spawn("--target", tiny_models["target"], "--drafter", tiny_models["drafter"], "--row-costs", GIVEN_COSTS))
        return children[-1]
    yield live
    for child in children:
        child.close(force=True)


@pytest.fixture
def repl(session):
    return session()


def test_commands_change_settings_and_help_shows_them(repl):
    command(repl, "/gamma 6", "gamma: 6")
    command(repl, "/length 12", "length: 12")
    command(repl, "/processor topk 0.7 20", "processor: topk temperature=0.7 top_k=20")
    command(repl, "/set_ngramstorage onelevel 4", "n-gram storage: onelevel 4")
    command(repl, "/top_k_filler 1", "top_k_filler: 1")
    command(repl, "/reset_in_between", "reset in between: off")
    command(repl, "/cache", "cache: off")
    command(repl, "/debug", "debug: on")
    command(repl, "/chat", "chat: off")
    command(repl, "/drafter", "Drafter AR: on")
    command(repl, "/target", "Target AR: off")
    command(repl, "/ngram", "N-gram assisted: off")
    command(repl, "/speculative", "Speculative: off")
    command(repl, "/pld", "Prompt lookup: off")
    command(repl, "/chained", "Chained n-gram\\+drafter: on")
    command(repl, "/pld_params 2 4 7", "n-grams 2 to 4, 7 tokens")
    command(repl, "/adaptive", "adaptive draft length: on")
    command(repl, "/min_draft 2", "min_draft: 2")
    command(repl, "/p_min 0.25", "p_min: 0.25")
    command(repl, "/pause 3 5", "after 3 fruitless steps, for 5 steps")
    command(repl, "/stream", "stream: on")
    command(repl, "/min_gain 1.4", "min_gain: 1.4")
    shown = command(repl, "/help", "Anything else is a prompt")
    for expected in ("[6]", "[12]", "[topk temperature=0.7 top_k=20]", "[onelevel 4]", "[2 4 7]", "[0.25]", "[3 5]"):
        assert expected in shown
    assert "Versions: torch 2." in shown and "· transformers " in shown  # what this session's figures are measured with
    # back to the defaults for the other tests
    for line in ("/gamma 4", "/length 35", "/processor greedy", "/set_ngramstorage basic 3", "/top_k_filler 3",
                 "/reset_in_between", "/cache", "/debug", "/chat", "/drafter", "/target", "/ngram", "/speculative", "/pld",
                 "/chained", "/pld_params 1 3 10", "/adaptive", "/min_draft 0", "/p_min 0", "/pause 0 8", "/stream", "/min_gain 0"):
        command(repl, line, r"\S")


BAD_INPUT = [
    ("/gamma", "usage: /gamma"), ("/gamma x", "usage: /gamma"), ("/gamma 0", "must be >= 1"), ("/length -3", "must be >= 1"),
    ("/length", "usage: /length"), ("/processor", "usage: /processor"), ("/processor beam 1", "unknown processor"),
    ("/processor topk 0.5", "usage: /processor topk"), ("/processor nucleus 0.5 0.9 3", "usage: /processor nucleus"),
    ("/processor multinomial 0", r"temperature must be in \[0.001, 1000\]"), ("/processor nucleus 1 1.5", r"top_p must be in \(0, 1\]"),
    ("/processor topk 1 zero", "usage: /processor topk"), ("/set_ngramstorage basic 1", "must be >= 2"),
    ("/set_ngramstorage trie 3", "usage: /set_ngramstorage"), ("/set_ngramstorage basic", "usage: /set_ngramstorage"),
    ("/top_k_filler 0", "must be >= 1"), ("/frobnicate", "unknown command"), ("/cache now", "usage: /cache"),
    ("/pld_params 3 2 5", "usage: /pld_params"), ("/pld_params 1 x 5", "usage: /pld_params"), ("/pld_params 1 2", "usage: /pld_params"),
    ("/p_min 1", "usage: /p_min"), ("/p_min", "usage: /p_min"), ("/p_min high", "usage: /p_min"), ("/min_draft -1", "must be >= 0"),
    ("/pause 1", "usage: /pause"), ("/pause 1 0", "must be >= 1"), ("/ngram_load /nonexistent.json", "cannot read"),
    ("/ngram_load infer.py", "not a valid n-gram storage file"), ("/ngram_save", "usage: /ngram_save"),
    ("/ngram_build /nonexistent.txt", "cannot read the corpus"), ("/stream on", "usage: /stream"), ("/min_gain -1", "usage: /min_gain"), ("/min_gain x", "usage: /min_gain"),
    ("/rounds 0", "must be >= 1"), ("/rounds x", "usage: /rounds"),
    ("/quit now", "/quit takes no argument"), ("/gamma 1e999", "gamma must be an integer"), ("/min_gain inf", "usage: /min_gain"),
    ("/length 99999999999999999999", "length must be >= 1 and <= 1000000"), ("/p_min nan", "usage: /p_min"),
]


def test_every_malformed_command_prints_usage_and_changes_nothing(repl):
    before = command(repl, "/help", "Anything else is a prompt")
    for line, expected in BAD_INPUT:
        out = command(repl, line, expected)
        assert "Traceback" not in out
    after = command(repl, "/help", "Anything else is a prompt")
    assert after == before


def test_prompt_produces_every_enabled_section_and_the_table(repl):
    command(repl, "/drafter", "Drafter AR: on")
    repl.sendline("Hello there")
    for section in ("Speculative", "N-gram assisted", "Target AR", "Drafter AR"):
        repl.expect(section)
        repl.expect("tokens/s")
    repl.expect("speedup")
    repl.expect(PROMPT)
    table = repl.before
    assert "1.00x" in table  # target AR against itself
    command(repl, "/drafter", "Drafter AR: off")


def _table_rows(text: str) -> dict:
    """strategy -> (tokens, accept, tok/step) from the comparison table (times left out)."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if len(cells) == 7 and cells[1].isdigit():
            rows[cells[0]] = (cells[1], cells[5], cells[6])
    return rows


def _compare(repl, prompt: str, title: str = "speedup") -> str:
    """Send a prompt; returns the comparison table (title, rows, policy caption)."""
    repl.sendline(prompt)
    repl.expect(title)
    text = repl.after
    repl.expect("policy:")
    text += repl.before + repl.after
    repl.expect(PROMPT)
    return text + repl.before


def test_gamma_is_a_bound_and_auto_a_choice_named_in_the_table(repl):
    command(repl, "/gamma 2", r"at most 2 drafts per step")
    _compare(repl, "Hello there", title="gamma <= 2")
    command(repl, "/gamma auto", "gamma: auto")
    assert "[auto]" in command(repl, "/help", "Anything else is a prompt")
    _compare(repl, "Hello there", title="gamma auto")
    command(repl, "/gamma 4", r"at most 4 drafts per step")


def test_a_prompt_gives_the_same_result_whatever_ran_before(repl):
    """The policy keeps nothing between prompts unless /memory is on: same tokens, acceptance, tokens per step."""
    command(repl, "/length 20", "length: 20")
    first = _table_rows(_compare(repl, "Repeat after me: one two three one two three"))
    _compare(repl, "Write something unexpected about zebras")
    again = _table_rows(_compare(repl, "Repeat after me: one two three one two three"))
    assert first and first == again
    command(repl, "/memory", "policy memory: on")
    assert "memory on" in command(repl, "/stats", "policy:")
    command(repl, "/memory", "policy memory: off")
    command(repl, "/length 35", "length: 35")


def test_strategies_drafting_from_the_storage_each_start_from_it_as_it_was_before_the_prompt(repl):
    """Chained drafting reads nothing that n-gram assisted decoding learned from the same prompt."""
    text = "Repeat after me: one two three one two three"
    command(repl, "/chained", "Chained n-gram\\+drafter: on")
    command(repl, "/length 20", "length: 20")
    with_ngram = _table_rows(_compare(repl, text))["Chained n-gram+drafter"]
    command(repl, "/ngram", "N-gram assisted: off")
    alone = _table_rows(_compare(repl, text))["Chained n-gram+drafter"]
    command(repl, "/ngram", "N-gram assisted: on")
    command(repl, "/chained", "Chained n-gram\\+drafter: off")
    command(repl, "/length 35", "length: 35")
    assert with_ngram == alone


def test_debug_view_shows_speculative_steps(repl):
    command(repl, "/debug", "debug: on")
    command(repl, "/length 6", "length: 6")
    repl.sendline("Hi")
    repl.expect("Speculative step")
    repl.expect("speedup")
    repl.expect(PROMPT)
    command(repl, "/debug", "debug: off")
    command(repl, "/length 35", "length: 35")


def test_debug_view_and_stream_never_share_a_line(repl):
    command(repl, "/debug", "debug: on")
    command(repl, "/stream", "stream: on")
    command(repl, "/length 8", "length: 8")
    repl.sendline("Hi there")
    repl.expect("speedup")
    shown = repl.before
    repl.expect(PROMPT)
    command(repl, "/stream", "stream: off")
    command(repl, "/debug", "debug: off")
    command(repl, "/length 35", "length: 35")
    headers = [line for line in shown.replace("\r", "").splitlines() if "Speculative step" in line]
    assert headers and all(line.startswith("Speculative step") for line in headers)
    assert all(" proposed, " in line or "no drafts" in line for line in headers)


def test_ctrl_c_stops_the_generation_and_the_repl_goes_on(repl):
    command(repl, "/length 3000", "length: 3000")
    command(repl, "/cache", "cache: off")  # slow enough to be interrupted
    command(repl, "/stream", "stream: on")  # a row's title is drawn as it starts: the Ctrl-C lands in its run, not at the prompt
    repl.sendline("Tell me a long story")
    repl.expect("Speculative")  # the first row's title: it is generating (before, a fixed 3 s sleep)
    repl.sendintr()
    repl.expect("interrupted")
    repl.expect(PROMPT)
    command(repl, "/stream", "stream: off")
    command(repl, "/cache", "cache: on")
    command(repl, "/length 35", "length: 35")


def test_ctrl_d_exits_with_status_zero(tiny_models):
    child = spawn("--target", tiny_models["target"])
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


@pytest.fixture(scope="module")
def piped(tiny_models, tmp_path_factory):
    """Sessions on a pipe or with --prompt, each a process of its own forked from one Python that
    imported the libraries once (``repl_driver.run_forked``; one for the file's piped sessions): "piped",
    "prompt", "no_drafter", "t5", and a drafter of the target's first layers: "layers" (of a three-layer
    target) and "too_deep" (as deep as the one-layer target)."""
    target, drafter = tiny_models["target"], tiny_models["drafter"]
    deep = save_tiny(tmp_path_factory.mktemp("deep"), llama(vocab=49152, window=4096, layers=3))  # tiny_models' target, three layers
    cases = {"piped": (["--target", target], "/length 5\nHello\n"),
             "prompt": (["--target", target, "--drafter", drafter, "--prompt", "Hi", "--length", "4"], ""),
             "no_drafter": (["--target", target], "/speculative\n/drafter\n"),
             "t5": (["--target", tiny_models["t5"], "--drafter", tiny_models["t5_drafter"], "--no-chat", "--length", "6"],
                    "/ngram\nTranslate this\n"),
             "layers": (["--target", deep, "--drafter", "layers:2", "--no-calibrate", "--prompt", "Hi", "--length", "6"], ""),
             "too_deep": (["--target", target, "--drafter", "layers:1", "--no-calibrate", "--prompt", "Hi"], "")}
    return dict(zip(cases, run_forked([args for args, _ in cases.values()], [text for _, text in cases.values()])))


def test_piped_prompt_runs_and_exits_at_end_of_input(piped):
    result = piped["piped"]
    assert result.returncode == 0, result.stderr
    assert "Target AR" in result.stdout and "N-gram assisted" in result.stdout and "Goodbye" in result.stdout


def test_prompt_flag_runs_one_comparison(piped):
    result = piped["prompt"]
    assert result.returncode == 0, result.stderr
    assert "Speculative" in result.stdout and "speedup" in result.stdout


def test_speculative_without_drafter_says_how_to_get_one(piped):
    result = piped["no_drafter"]
    assert result.stdout.count("restart with --drafter MODEL") == 2 and result.returncode == 0


def test_a_drafter_made_of_the_targets_first_layers_drafts_in_the_repl(piped):
    result, refused = piped["layers"], piped["too_deep"]
    assert result.returncode == 0, result.stderr
    assert "first 2 layers of the target" in result.stdout and "Speculative" in result.stdout
    assert refused.returncode == 1 and "a drafter needs fewer layers than the target" in refused.stdout


def test_encoder_decoder_models_are_detected_and_use_the_encoder_decoder_functions(piped):
    result = piped["t5"]
    assert result.returncode == 0, result.stderr
    assert "decoder-only models only" in result.stdout
    assert "Speculative" in result.stdout and "Target AR" in result.stdout
    assert "N-gram assisted ─" not in result.stdout  # no section for it


def test_stats_and_stream_show_the_last_prompt(repl):
    command(repl, "/stream", "stream: on")
    command(repl, "/length 8", "length: 8")
    repl.sendline("Hello")
    repl.expect("speedup")
    repl.expect(PROMPT)
    out = command(repl, "/stats", "Statistics of the last prompt")
    repl.sendline("/stats")
    repl.expect("acceptance by draft position")
    repl.expect("policy chose: drafted in")  # the automatic choice is named, with what it chose from
    repl.expect(PROMPT)
    assert "target passes" in out and "drafted" in out
    command(repl, "/stream", "stream: off")
    command(repl, "/length 35", "length: 35")


def test_ngram_storage_can_be_built_saved_and_loaded(repl, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The quick brown fox jumps over the lazy dog.\n")
    command(repl, f"/ngram_build {corpus}", "static n-gram tier")
    command(repl, f"/ngram_save {tmp_path / 'own.json'}", "saved to")
    command(repl, f"/ngram_load {tmp_path / 'own.json'}", "static n-gram tier")
    assert (tmp_path / "own.json").stat().st_size > 0
    shown = command(repl, "/help", "Anything else is a prompt")
    assert "[static tier loaded]" in shown


def test_quit_exits_with_status_zero(repl):
    """The shared REPL, after every test above (last: a start of its own saved; a test after it gets a fresh REPL)."""
    repl.sendline("/quit")
    repl.expect(pexpect.EOF)
    repl.close()
    assert repl.exitstatus == 0
