"""The state the fast paths keep beside a model (prepacked layers, blocked copies, the C step's
copies) dies with the model, follows every change of its weights, and never changes another
model's: what a notebook that loads, edits, casts and drops models relies on."""
import gc
import weakref

import pytest
import torch

from conftest import EOS_NEVER, PROMPT, llama
from kernels import skinny
from kernels.one_copy import held, released
from kernels.prepacking import PREPACKED, SKINNY, PrepackedLinear, prepackable, set_prepack
from runners import KVCacheModel, LeanRunner
from sampling import autoregressive_generate

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(not skinny.available()[0], reason="the skinny kernel is not built here"),
              pytest.mark.skipif(not prepackable(llama().to(torch.float32)), reason="needs oneDNN (mkldnn)")]


def _tensors_of(model) -> list:
    """Every weight the model and its prepacked layers hold now: parameters, blocked copies, oneDNN copies."""
    found = list(model.parameters())
    for m in model.modules():
        if type(m) is PrepackedLinear:
            found += [t for t in (m.blocks, m.linear[0]._parameters.get("weight")) if t is not None]
    return found


@pytest.mark.parametrize("route", [(SKINNY,), (PREPACKED,)])
def test_a_dropped_prepacked_model_frees_its_layers_and_weights(route):
    """Run, drop, collect: no module-level registry keeps the model, its prepacked layers or any of
    their weights (a notebook that loads models in a loop holds one at a time)."""
    model = llama(layers=2).to(torch.float32)
    set_prepack(model, True, route)
    autoregressive_generate(PROMPT, model, 8, eos_tokens_id=EOS_NEVER, use_cache=True)
    KVCacheModel(model)(torch.tensor([PROMPT]), 2)  # the torch forward on the route too
    layers = [m for m in model.modules() if type(m) is PrepackedLinear]
    assert layers
    refs = [weakref.ref(x) for x in (model, *layers, *_tensors_of(model))]
    del model, layers
    gc.collect()
    assert [r for r in refs if r() is not None] == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_dropped_runner_and_model_free_the_c_steps_copies(dtype):
    """The C step's blocked copies (the released layers' and the output layer's, kept beside its
    weight for the whole run) go with the runner and the model: none stays in ``kernels.blocked``."""
    model = llama(layers=2).to(dtype)
    runner = LeanRunner(model)
    runner(torch.tensor([PROMPT]), 1)
    step = runner.step
    refs = [weakref.ref(x) for x in (model, step, step.head, *step.keep, *_tensors_of(model))]
    del model, runner, step
    gc.collect()
    assert [r for r in refs if r() is not None] == []


def test_a_model_whose_own_layers_came_back_frees_its_prepacked_copies():
    """``set_prepack(False)`` after a pass: the prepacked layers kept for a later ``set_prepack(True)`` go with the model."""
    model = llama(layers=2).to(torch.float32)
    set_prepack(model, True, (PREPACKED,))
    KVCacheModel(model)(torch.tensor([PROMPT]), 2)
    layers = [m for m in model.modules() if type(m) is PrepackedLinear]
    set_prepack(model, False)
    refs = [weakref.ref(x) for x in (model, *layers, *(m.packed for m in layers if m.packed is not None))]
    del model, layers
    gc.collect()
    assert [r for r in refs if r() is not None] == []


IDS = torch.randint(96, (1, 12), generator=torch.Generator().manual_seed(3))


def stepped(dtype: torch.dtype = torch.float32):
    """A float32 (or ``dtype``) model after a pass on the C step (its decoder layers released), and that runner."""
    model = llama(layers=2).to(dtype)
    runner = LeanRunner(model)
    runner(IDS[:, :6], 1)
    assert released(model.model.layers[0].self_attn.q_proj) and runner.step
    return model, runner


def eager(model, ids=IDS) -> torch.Tensor:
    """The last 3 positions' logits of a fresh model of ``model``'s dtype on its weights, by
    transformers' own forward (plain ``nn.Linear`` layers)."""
    fresh = llama(layers=2).to(next(model.parameters()).dtype)
    fresh.load_state_dict(model.state_dict())
    with torch.no_grad():
        return fresh(ids).logits[0, -3:]


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)  # the skinny kernel rounds apart from MKL


def other_weights(seed: int = 5) -> dict:
    return llama(layers=2, seed=seed).to(torch.float32).state_dict()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_a_cast_after_a_pass_casts_the_whole_model(dtype):
    """``.to(dtype)`` after the C step released the layers: every parameter cast, the same values
    (no layer left behind, no embedding cast alone), and transformers' forward is a fresh model's."""
    model, _ = stepped()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.to(dtype)
    assert not any(released(m) for m in model.modules())
    assert all(p.dtype == dtype for p in model.parameters())
    assert all(torch.equal(model.state_dict()[k], v.to(dtype)) for k, v in before.items())
    if dtype == torch.float64:
        with torch.no_grad():
            assert torch.equal(model(IDS).logits[0, -3:], eager(model))


def test_a_cast_back_to_float32_runs_the_step_on_the_models_weights():
    """float32 -> float64 -> float32, with a new weight loaded in float64: the runner that held a C step
    and a new one both compute from the current weights (never the blocked float32 copies of before)."""
    model, runner = stepped()
    model.to(torch.float64)
    model.load_state_dict(other_weights())
    model.to(torch.float32)
    expected = eager(model)
    close(LeanRunner(model)(IDS, 3), expected)
    runner.rollback(0)
    close(runner(IDS, 3), expected)
    assert released(model.model.layers[0].self_attn.q_proj)  # the step released the new weights


@pytest.mark.parametrize("assign", [False, True])
def test_loading_a_state_dict_after_a_pass_loads_every_weight(assign):
    """``load_state_dict(sd)`` / ``(sd, assign=True)`` after the C step's pass: the model holds ``sd``
    (every key), and the runner that held a C step and a new runner compute from it."""
    model, runner = stepped()
    sd = other_weights()
    model.load_state_dict(sd, assign=assign)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in sd.items())
    expected = eager(model)
    with torch.no_grad():
        close(model(IDS).logits[0, -3:], expected)
    runner.rollback(0)
    close(runner(IDS, 3), expected)
    close(LeanRunner(model)(IDS, 3), expected)


def test_a_bfloat16_model_after_a_pass_loads_casts_and_steps_on_its_current_weights():
    """bfloat16, released: a no-op move keeps it released; a load gives every layer its weight back and
    the runner that held a step computes from the loaded weights (a new one's logits, bit for bit); a
    cast to float32 widens every weight exactly, and the step runs it in float32, released again."""
    model, runner = stepped(torch.bfloat16)
    model.to(torch.bfloat16)
    assert released(model.model.layers[0].self_attn.q_proj)
    other = llama(layers=2, seed=5).to(torch.bfloat16)
    model.load_state_dict(other.state_dict())
    assert not any(released(m) for m in model.modules())
    runner.rollback(0)
    assert torch.equal(runner(IDS, 3), LeanRunner(other)(IDS, 3))
    assert released(model.model.layers[0].mlp.down_proj) and model.model.layers[0].mlp.down_proj.blocks.dtype == torch.bfloat16
    model.float()
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(torch.equal(model.state_dict()[k], v.float()) for k, v in other.state_dict().items())
    assert torch.equal(LeanRunner(model)(IDS, 3), LeanRunner(other.float())(IDS, 3))
    assert model.model.layers[0].mlp.down_proj.blocks.dtype == torch.float32


@pytest.mark.parametrize("shape", [(48, 40), (50, 1100), (7, 4)])
def test_a_bfloat16_blocked_copy_unpacks_to_its_weight_bit_for_bit(shape):
    """``unpack`` of the bfloat16 layout (``[N/16][K/2][16][2]``: the one copy ``restore`` reads back):
    every bit, -0.0, NaN and the last partial block's features too."""
    from kernels.blocked import pack, unpack

    weight = torch.randn(shape, generator=torch.Generator().manual_seed(0)).bfloat16()
    weight[0, 0], weight[-1, -1] = -0.0, float("nan")
    assert torch.equal(unpack(pack(weight), shape[0]).view(torch.int16), weight.view(torch.int16))


def test_a_refused_load_changes_no_weight():
    """A state dict of the wrong shapes: refused, and every weight is what it was."""
    model, _ = stepped()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    wrong = llama(layers=2, vocab=120).to(torch.float32).state_dict()
    with pytest.raises(RuntimeError):
        model.load_state_dict({k: v for k, v in wrong.items() if "embed" in k or "lm_head" in k}, strict=False)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())


def test_an_edit_through_data_is_seen_by_the_next_runner():
    """``w.data.mul_`` bumps no version counter the copies could see: a runner made after it (its C
    step compares each copy it reads with its weight) computes from the edited weights, the output
    layer's (blocked beside the weight for good) and a held layer's own (blocked beside it)."""
    model, _ = stepped()
    model.lm_head.weight.data.mul_(0.5)
    close(LeanRunner(model)(IDS, 3), eager(model))
    with held(model):  # the own weights back: their blocked copies sit beside them
        q = model.model.layers[1].self_attn.q_proj
        LeanRunner(model)(IDS, 1)
        q.weight.data.mul_(2.0)
        close(LeanRunner(model)(IDS, 3), eager(model))


def test_a_page_drop_never_changes_another_tensors_weights(tmp_path):
    """A model read from float32 safetensors holds its weights in a private mapping of the file; the
    C step gives back the pages of the weights it frees. Model B built on A's tensors
    (``assign=True``) views the same pages: they stay, and B's weights keep their values (edited
    after loading, so that pages given back would read the file's, other, values)."""
    from transformers import LlamaForCausalLM

    llama(layers=2).to(torch.float32).save_pretrained(tmp_path)
    a = LlamaForCausalLM.from_pretrained(tmp_path, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        for p in a.parameters():
            p.mul_(2.0)  # written: this process's own copies of the file's pages
    b = LlamaForCausalLM(a.config).eval()
    b.load_state_dict(a.state_dict(), assign=True)
    saved = {k: v.clone() for k, v in b.state_dict().items()}
    LeanRunner(a)(IDS, 1)
    assert released(a.model.layers[0].mlp.gate_proj)
    assert [k for k, v in saved.items() if not torch.equal(b.state_dict()[k], v)] == []


def test_the_pages_of_weights_no_tensor_views_are_given_back(tmp_path, monkeypatch):
    """The other side of the page drop: a model alone on its file's pages gives back those of every
    released weight that spans a whole page (the memory the one copy saves)."""
    from transformers import LlamaForCausalLM

    import kernels.file_pages as file_pages

    given = []

    class Libc:
        def madvise(self, start, size, advice):
            given.append(size.value)

    llama(layers=2).to(torch.float32).save_pretrained(tmp_path)
    a = LlamaForCausalLM.from_pretrained(tmp_path, torch_dtype=torch.float32).eval()
    monkeypatch.setattr(file_pages, "_libc", lambda: Libc())
    LeanRunner(a)(IDS, 1)
    assert len(given) >= 2 * 3 and sum(given) >= 2 * 3 * 4096  # gate, up, down of each layer span 8 KiB: a page at least


@pytest.mark.parametrize("shape", [(48, 40), (50, 1100), (7, 3)])
def test_the_blocked_check_in_c_sees_what_the_torch_check_sees(shape):
    """``skinny.holds`` (in C) answers as ``blocked.holds`` (torch) does: a copy that holds
    its weight, one bit flipped anywhere (the last partial block and a second chunk of inputs too),
    and -0.0 written over 0.0 (bits, not values)."""
    from kernels.blocked import holds, pack

    torch.manual_seed(0)
    weight = torch.randn(shape)
    weight[0, 0] = 0.0
    blocks = pack(weight)
    assert skinny.holds(blocks, weight) is True and holds(blocks, weight)  # in C, in torch
    for n, k in [(0, 0), (shape[0] - 1, shape[1] - 1), (shape[0] // 2, shape[1] // 2)]:
        edited = weight.clone()
        edited[n, k] = -0.0 if (n, k) == (0, 0) else edited[n, k] * 1.5
        assert skinny.holds(blocks, edited) is False and not holds(blocks, edited)
