"""The loops print nothing: the debug view and streams are observers that see every step and
compose on one screen, and the debug view reads as text."""
import subprocess
import sys
from pathlib import Path

import pytest
from rich.text import Text
from transformers import AutoTokenizer

from conftest import EOS_NEVER, PROMPT, llama, perturbed_copy
from sampling import GenerationConfig, GenerationStats, Observer, Step, speculative_generate
from drafters import ModelDrafter
from sampling.speculative_decoding import draft_and_verify
from runners import KVCacheModel
from utils.models import embedded_model_dir
from utils.printing import DebugView, screen

ROOT = Path(__file__).resolve().parents[1]


class Recorder(Observer):
    def __init__(self):
        self.steps = []

    def on_step(self, step):
        self.steps.append((list(step.proposed), step.accepted, list(step.emitted), step.stopped))


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(embedded_model_dir())


def test_the_generation_loops_import_nothing_that_prints():
    code = ("import sys, sampling, ngram_assisted\n"
            "print(sorted(m for m in sys.modules if m == 'utils.printing' or m.split('.')[0] == 'rich'))")
    shown = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert shown.strip() == "[]"


def test_observers_see_every_step_and_the_debug_view_changes_no_token(capsys):
    target = llama()
    drafter = perturbed_copy(target, 0.2, seed=1)
    common = dict(gamma=3, max_gen_len=30, eos_tokens_id=EOS_NEVER, use_cache=True)
    stats = GenerationStats()
    plain, _ = speculative_generate(PROMPT, drafter, target, stats=stats, **common)
    seen = Recorder()
    config = GenerationConfig(gamma=3, max_gen_len=30, use_cache=True, vocab_size=target.config.vocab_size, observers=(seen,))
    observed = draft_and_verify(list(PROMPT), KVCacheModel(target, True), ModelDrafter.of(drafter, config), config)
    debugged, _ = speculative_generate(PROMPT, drafter, target, debug=True, **common)
    assert plain == observed == debugged
    assert [t for _, _, emitted, _ in seen.steps for t in emitted] == plain
    assert len(seen.steps) == stats.target_forward_passes
    assert sum(len(proposed) for proposed, *_ in seen.steps) == stats.drafted
    assert sum(accepted for _, accepted, *_ in seen.steps) == stats.accepted
    assert capsys.readouterr().out.count("Speculative step") == stats.target_forward_passes


def test_the_debug_header_counts_proposed_and_accepted_drafts(capsys):
    tokens = [1, 2, 3, 10, 11]  # prompt [1, 2], then 3, then drafts 10 11 accepted (12 13 rejected), own token 20
    DebugView().on_step(Step(tokens + [20], 3, 2, [10, 11, 12, 13], 2, 20, False))
    shown = capsys.readouterr().out
    assert "4 drafts proposed, 2 accepted + 1 token" in shown
    assert "3 10 11 12 13 20" in shown


def test_the_debug_view_shows_readable_text_not_byte_level_pieces(capsys, tokenizer):
    ids = tokenizer("How are you?\nFine, thanks", add_special_tokens=False).input_ids
    assert any("Ġ" in p or "Ċ" in p for p in tokenizer.convert_ids_to_tokens(ids))  # what the old view printed
    view = DebugView(tokenizer)
    assert "".join(view.pieces([], ids)) == "How are you?\\nFine, thanks"
    DebugView(tokenizer).on_step(Step(ids, 2, 0, ids[2:5], 1, ids[5], False))
    shown = capsys.readouterr().out
    assert "Ġ" not in shown and "Ċ" not in shown and "How are" in shown


def test_streamed_text_and_the_next_debug_step_do_not_share_a_line(capsys):
    screen.inline(Text("colors again"))
    DebugView().on_step(Step([1, 2, 3], 2, 1, [], 0, 3, False))
    screen.inline(Text(" more"))
    screen.end_line()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "colors again"
    assert lines[1].startswith("Speculative step no drafts + 1 token")

