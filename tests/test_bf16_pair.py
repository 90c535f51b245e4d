"""A pair's two bfloat16 models each on the path chosen for its own shapes (kernels/bf16.py: one path per
gate/up shape in a process): each measured on its own linears and named in its own header line; each
model's logits the same at every pass width on its own path; greedy speculative decoding with the two
on two different paths emits the target's autoregressive tokens (the drafter's logits never mix with
the target's, so its path changes only which drafts are proposed)."""
import weakref
from typing import Dict, Tuple

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from conftest import EOS_NEVER, PROMPT, VOCAB, llama, save_tiny
from invariance import widths_agree
import kernels.bf16 as bf16
from kernels import bf16_choice as choice
from kernels import skinny
from kernels.c_step import gate_up_shape, label, short_label
from kernels.step_pool import shared_step
from repl_driver import run
from runners import LeanRunner
from sampling import autoregressive_generate, speculative_generate
from test_lean_runner import ids_for

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(not skinny.available()[0], reason="the skinny kernel is not built here")]


def other_shape(vocab: int = VOCAB, layers: int = 1, seed: int = 1) -> LlamaForCausalLM:
    """A drafter whose gate/up is another shape than ``conftest.llama``'s (intermediate 96, not 64)."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=96, num_hidden_layers=layers, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=False)
    return LlamaForCausalLM(config).eval()


@pytest.fixture
def fresh(monkeypatch):
    """No choice made yet (the process's own put back after), nothing forced; at least two paths built."""
    monkeypatch.setattr(bf16, "_DECIDED", weakref.WeakKeyDictionary())
    monkeypatch.setattr(bf16, "FORCED", None)
    monkeypatch.setattr(bf16, "FORCED_FOR", {})
    monkeypatch.setattr(bf16, "FORCED_TILE", None)
    built = bf16.paths(skinny.library())
    if len(built) < 2:
        pytest.skip("one bfloat16 path built here: nothing to choose")
    return built


def by_shape(fastest: Dict[Tuple[int, int], int]):
    """A timer maker as ``choice.linear_timer``: on a linear of shape s, path ``fastest[s]`` takes 0.4 ms
    at one row and every other 1 ms; every many-row run 1 ms (so the one-row times decide)."""
    def make(library, shape, threads, weights=None):
        def run_(path: int, tile: int, rows: int) -> float:
            return 1e-3 if rows > 1 or path != fastest[tuple(shape)] else 0.4e-3
        return run_
    return make


def test_each_model_measures_its_own_shape_takes_its_fastest_path_and_names_it(fresh, monkeypatch):
    target, drafter = llama().to(torch.bfloat16), other_shape().to(torch.bfloat16)
    shapes = gate_up_shape(target), gate_up_shape(drafter)
    assert shapes[0] != shapes[1]
    picks = {shapes[0]: fresh[1], shapes[1]: fresh[0]}
    monkeypatch.setattr(choice, "linear_timer", by_shape(picks))
    ids = ids_for(30)
    for model, shape in zip((target, drafter), shapes):
        LeanRunner(model)(ids, 1)
        assert shared_step(model).dims.weights == picks[shape]
        assert short_label(model) == f"C step, {bf16.NAMES[picks[shape]]} by measurement"
        assert f"read by the {bf16.NAMES[picks[shape]]}, " in label(model)
        assert f"{shape[0]}x{shape[1]} linear" in label(model), label(model)
    other = llama(seed=3).to(torch.bfloat16)  # the target's shape: its choice, nothing measured again
    monkeypatch.setattr(choice, "linear_timer", None)
    LeanRunner(other)(ids, 1)
    assert shared_step(other).dims.weights == picks[shapes[0]]


def two_paths(built) -> Tuple[int, int]:
    """Two paths that give different bits where built: one that rounds the activations and a widening one."""
    rounding = [p for p in built if p in bf16.ROUNDING]
    widening = [p for p in built if p not in bf16.ROUNDING]
    return (rounding[0], widening[0]) if rounding and widening else (built[0], built[1])


def test_each_model_is_width_invariant_on_its_own_path_and_speculative_equals_target_ar(fresh, monkeypatch):
    target, drafter = llama(layers=2).to(torch.bfloat16), other_shape(layers=1).to(torch.bfloat16)
    paths = two_paths(fresh)
    monkeypatch.setattr(bf16, "FORCED_FOR", {gate_up_shape(target): paths[0], gate_up_shape(drafter): paths[1]})
    ids = ids_for()
    for model, path in zip((target, drafter), paths):
        runner = LeanRunner(model)
        widths_agree(runner, ids)
        assert runner.step.dims.weights == path
    reference = autoregressive_generate(PROMPT, target, 40, eos_tokens_id=EOS_NEVER, use_cache=True)
    out, rate = speculative_generate(PROMPT, drafter, target, gamma=4, max_gen_len=40, eos_tokens_id=EOS_NEVER, use_cache=True)
    assert out == reference
    assert shared_step(target).dims.weights == paths[0] and shared_step(drafter).dims.weights == paths[1]
    assert "forced" in short_label(target) and bf16.NAMES[paths[1]] in short_label(drafter)


def test_the_repl_header_names_each_models_path_measured_on_its_own_shape(tmp_path, fresh):
    target = llama(vocab=49152, window=4096, layers=1)
    target.config.eos_token_id = 2
    drafter = other_shape(vocab=49152)
    drafter.config.eos_token_id = 2
    shapes = gate_up_shape(target), gate_up_shape(drafter)
    folders = save_tiny(tmp_path / "target", target), save_tiny(tmp_path / "drafter", drafter)
    result = run("--target", folders[0], "--drafter", folders[1], "--dtype", "bfloat16", "--prompt", "Hi", "--length", "4",
                 "--no-calibrate", "--verbose")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    lines = [next(line for line in result.stdout.splitlines() if line.startswith(role)) for role in ("Target:", "Drafter:")]
    for line, (n, k) in zip(lines, shapes):
        assert "on the C step (bfloat16 weights read by the " in line, line
        assert f"{n}x{k} linear" in line, line  # measured on its own gate/up
    assert "Speculative" in result.stdout


def test_a_models_own_layers_take_its_c_steps_path_whichever_model_came_first(fresh, monkeypatch):
    """The layer route (a peer's row, transformers' generate on the model) runs each linear on the path its
    model's C step took, not on the first model's of the process."""
    from kernels.prepacking import SKINNY, set_prepack

    target, drafter = llama(layers=2).to(torch.bfloat16), other_shape(layers=1).to(torch.bfloat16)
    paths = two_paths(fresh)
    monkeypatch.setattr(bf16, "FORCED_FOR", {gate_up_shape(target): paths[0], gate_up_shape(drafter): paths[1]})
    ids = ids_for()
    for model in (target, drafter):  # the target decides first
        LeanRunner(model)(ids[:, :8], 1)
    taken, real = [], bf16.chosen
    monkeypatch.setattr(bf16, "chosen", lambda *a, **k: taken.append(real(*a, **k)) or taken[-1])
    assert set_prepack(drafter, True, (SKINNY,), dtypes=(torch.bfloat16,))
    with torch.inference_mode():
        drafter(ids[:, :8])
    assert taken and set(taken) == {paths[1]}, (taken, paths)
