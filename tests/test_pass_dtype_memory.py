"""A first start of a pair sized as the real one within issue 71's memory rule, on every dtype route: at most
1.2x the pair's float32 weights plus 1 GiB (here in proportion: the real pair's 1 GiB is 11% of its weights)
and the caches; halved where nothing loads in float32 (``--dtype bfloat16``). The models are loaded from
float32 folders as the REPL loads them (``load_pair`` -> ``utils.models.load_model``, tensor by tensor: each
weight in memory of its own), their tables two, as the installed pair's. Where a dtype is raced, each model's
two copies are held at once (1.5x its own) with both C steps' set-up, the one not chosen freed before the next
model loads. Counted by torch's allocator (``utils.allocations``), never by a clock; the pass times are given
(each pass still runs) so that each route's dtypes are chosen."""
from typing import Dict, Tuple

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from app.pair import LoadOptions, load_pair
from conftest import save_tiny
from kernels import skinny
from kernels.prepacking import SKINNY, plan
from measure import timing
from runners import LeanRunner
from runners.static import STATIC_ROUND, STATIC_SLACK
from utils.allocations import counted

pytestmark = [pytest.mark.needs_cc, pytest.mark.skipif(not skinny.available()[0], reason="the skinny kernel is not built here")]

LIMIT = 1.2  # the most a first start may hold, in the pair's float32 weights, plus 1 GiB (and the caches)
SLACK = 1 / 8.97  # issue 71's 1 GiB beside the real pair's 8.97 GiB of float32 weights, in proportion at this size
CONTEXT = 64 + STATIC_SLACK + STATIC_ROUND  # positions a race's timer caches at most
SHAPES = {"target": (512, 8), "drafter": (384, 4)}  # 128 MB and 51 MB of float32 weights: 0.4, near the pair's 0.35
# the kernel measurement of a float32 model here times passes over 1-4 positions, not the programs' 1-12: what a
# start holds is its copies of the weights, switched between the same options in the same order whatever the widths
# (the peaks the same to 32 KB, a 12-position pass's activations, 2026-11-30), with a third of the passes (the
# float32 route 12 s -> 6 s, interleaved, noisy)
KERNEL_WIDTHS = 4


def shaped(hidden: int, layers: int, tie: bool = False) -> LlamaForCausalLM:
    """A float32 Llama of the pair's proportions, its tables two (as the installed pair's) or one (``tie``)."""
    torch.manual_seed(hidden)
    config = LlamaConfig(vocab_size=8192, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                         num_attention_heads=8, num_key_value_heads=1, max_position_embeddings=256, tie_word_embeddings=tie)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> Dict[str, Tuple[str, int]]:
    """The pair's two float32 folders (one safetensors file each, as ``make fetch-pair`` converts them), each
    with its float32 weights' bytes (counted here: the C step releases a started model's layers)."""
    root = tmp_path_factory.mktemp("pair")
    models = {role: shaped(*shape) for role, shape in SHAPES.items()}
    return {role: (save_tiny(root / role, model), sum(p.numel() * 4 for p in model.parameters())) for role, model in models.items()}


def caches(model) -> int:
    """Bytes of a race's two timers' float32 KV caches (the step keeps a bfloat16 model's in float32 too)."""
    config = model.config
    head = config.hidden_size // config.num_attention_heads
    return 2 * CONTEXT * config.num_hidden_layers * 2 * config.num_key_value_heads * head * 4


# route: (--dtype, --drafter-dtype, bfloat16's share of a float32 pass: the target's, the drafter's; the dtypes kept)
ROUTES = {"auto, the drafter bfloat16": ("auto", "auto", 0.9, 0.5, torch.float32, torch.bfloat16),
          "auto, both float32": ("auto", "auto", 0.9, 0.9, torch.float32, torch.float32),
          "auto, the target bfloat16": ("auto", "auto", 0.5, 0.5, torch.bfloat16, torch.bfloat16),
          "float32": ("float32", "float32", 1.0, 1.0, torch.float32, torch.float32),
          "bfloat16": ("bfloat16", "bfloat16", 1.0, 1.0, torch.bfloat16, torch.bfloat16)}


@pytest.mark.parametrize("route", ROUTES)
def test_a_first_start_of_the_pair_stays_within_1_2x_its_float32_weights_on_every_dtype_route(monkeypatch, tmp_path, folders, route):
    """Through ``load_pair`` with ``--preset pair``'s dtype measurement, the models read from their folders inside the
    count: a load that mapped its file whole kept every released weight's bytes (the C step's blocks beside the
    mapped file, 2x), and a bfloat16 load held the float32 file beside its bfloat16 weights (twice the halved limit)."""
    target_dtype, drafter_dtype, target_share, drafter_share, *kept = ROUTES[route]
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    real = timing.PassTimer.seconds

    def seconds(self, rows: int) -> float:  # float32 fastest on the C step's blocks (skinny), as on a quiet CPU; bfloat16 a share of that
        real(self, rows)
        share = target_share if self.model.config.hidden_size == SHAPES["target"][0] else drafter_share
        if self.model.model.embed_tokens.weight.dtype == torch.bfloat16:
            return 0.005 * share
        return 0.005 * (1.0 if plan(self.model) == (SKINNY,) else 2.0) * rows ** 0.5

    monkeypatch.setattr(timing.PassTimer, "seconds", seconds)
    measure_kernels = timing.measure_kernels
    monkeypatch.setattr(timing, "measure_kernels", lambda *args, **kwargs: measure_kernels(*args, **{**kwargs, "max_rows": KERNEL_WIDTHS}))
    options = LoadOptions("cpu", dtype=target_dtype, drafter_dtype=drafter_dtype, measure_dtype=True, calibrate=False,
                          cache="dynamic")
    with counted() as held:
        pair = load_pair(folders["target"][0], folders["drafter"][0], options, say=lambda text, style="": None)
        for model in (pair.target, pair.drafter):  # a first pass each, as the first run's: the C step's, where it takes the model
            LeanRunner(model)(torch.arange(1, 9).unsqueeze(0), 1)
    weights = folders["target"][1] + folders["drafter"][1]
    narrow = route == "bfloat16"  # nothing loads in float32
    allowed = (LIMIT + SLACK) * weights / (2 if narrow else 1) + caches(pair.target) + caches(pair.drafter)
    assert [pair.target.dtype, pair.drafter.dtype] == kept
    assert all(set(plan(model)) == {SKINNY} for model in (pair.target, pair.drafter) if model.dtype == torch.float32)  # blocked, released
    assert held.peak <= allowed, f"{held.peak / weights:.2f}x the pair's float32 weights (allowed {allowed / weights:.2f}x)"
