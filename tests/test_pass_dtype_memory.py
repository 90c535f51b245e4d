"""The automatic dtypes within issue 71's memory rule: a first start of a pair sized as the real one (its
drafter about a third of its target, tied tables) holds at most 1.2x the pair's float32 weights plus 1 GiB
(here in proportion: the real pair's 1 GiB is 11% of its weights) and the caches while its target and its
drafter are each raced in both dtypes: each model's two copies at once (1.5x its own) with both C steps'
set-up, the one not chosen freed before the next model loads (measured here: 1.28x). Counted by torch's allocator (``utils.allocations``),
never by a clock; the pass times are given (each pass still runs)."""
import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

import app.pair

from app.pair import LoadOptions, load_pair
from conftest import save_tiny
from kernels import skinny
from measure import timing
from runners.static import STATIC_ROUND, STATIC_SLACK
from utils.allocations import counted

pytestmark = [pytest.mark.needs_cc, pytest.mark.skipif(not skinny.available()[0], reason="the skinny kernel is not built here")]

LIMIT = 1.2  # the most a first start may hold, in the pair's float32 weights, plus 1 GiB (and the caches)
SLACK = 1 / 8.97  # issue 71's 1 GiB beside the real pair's 8.97 GiB of float32 weights, in proportion at this size
CONTEXT = 64 + STATIC_SLACK + STATIC_ROUND  # positions a race's timer caches at most


def tied(hidden: int, layers: int) -> LlamaForCausalLM:
    torch.manual_seed(hidden)
    config = LlamaConfig(vocab_size=8192, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                         num_attention_heads=8, num_key_value_heads=1, max_position_embeddings=256, tie_word_embeddings=True)
    return LlamaForCausalLM(config).eval()


def float32_bytes(model) -> int:
    return sum(p.numel() * 4 for p in model.parameters())


def caches(model) -> int:
    """Bytes of a race's two timers' float32 KV caches (the step keeps a bfloat16 model's in float32 too)."""
    config = model.config
    head = config.hidden_size // config.num_attention_heads
    return 2 * CONTEXT * config.num_hidden_layers * 2 * config.num_key_value_heads * head * 4


@pytest.mark.parametrize("drafter_share", [0.5, 0.9])
def test_a_first_start_racing_both_models_dtypes_stays_within_1_2x_the_pairs_float32_weights(tmp_path, monkeypatch, drafter_share):
    """Loaded into torch's allocator (as ``scripts/start_bytes.py`` does: a model mapped from its file is not
    counted there, nor are its pages given back), each model's bfloat16 copy made and raced, through
    ``load_pair``; the target keeps float32, so that its drafter races too."""
    shapes = {"target": (512, 8), "drafter": (384, 4)}  # 111 MB and 39 MB of float32 weights: 0.35, as the pair's 0.5B to its 1.5B
    # saved before the private cache folder is set: save_tiny copies the embedded model's tokenizer from the
    # run's cache, where a fresh folder would convert the embedded GGUF first (~20-40 s a test) for its files
    folders = {role: save_tiny(tmp_path / role, tied(*shape)) for role, shape in shapes.items()}
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    made = []

    def load(role, name, where, dtype, quantize, trust_remote_code, target=None, say=None):
        assert dtype == "float32"  # a first start loads float32, then copies it
        model = tied(*shapes[role])
        made.append(float32_bytes(model))
        return model, AutoTokenizer.from_pretrained(folders["target"]) if role == "target" else None, name

    real = timing.PassTimer.seconds

    def seconds(self, rows: int) -> float:
        real(self, rows)
        share = 0.9 if self.model.config.hidden_size == 512 else drafter_share
        return 0.010 * (share if self.model.model.embed_tokens.weight.dtype == torch.bfloat16 else 1.0)

    monkeypatch.setattr(timing.PassTimer, "seconds", seconds)
    monkeypatch.setattr(app.pair, "_load", load)
    with counted() as held:
        pair = load_pair(folders["target"], folders["drafter"], LoadOptions("cpu", measure_dtype=True, calibrate=False, prepack="off"),
                         say=lambda text, style="": None)
    weights = sum(made)
    allowed = (LIMIT + SLACK) * weights + caches(pair.target) + caches(pair.drafter)
    chosen = pair.drafter.model.embed_tokens.weight.dtype
    assert pair.target.model.embed_tokens.weight.dtype == torch.float32 and chosen == (torch.bfloat16 if drafter_share < 0.8 else torch.float32)
    assert held.peak <= allowed, f"{held.peak / weights:.2f}x the pair's float32 weights (allowed {allowed / weights:.2f}x)"
