"""One C step per model (kernels/step_pool.py): every runner of a model runs the same step, which is
never replayed stale (a weight changed in place, through ``.data``, replaced, loaded or cast: the
next runner makes a fresh one, whose logits follow the new weights), dies with its model, and lets
go of the blocks a restore frees."""
import gc
import weakref

import pytest
import torch

from conftest import llama
from kernels import skinny
from kernels.one_copy import held, released
from kernels.prepacking import prepackable
from kernels.step_pool import kept_step
from models.llama import new_cache
from runners import LeanRunner

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(not skinny.available()[0], reason="the skinny kernel is not built here"),
              pytest.mark.skipif(not prepackable(llama().to(torch.float32)), reason="needs oneDNN (mkldnn)")]

IDS = torch.randint(96, (1, 12), generator=torch.Generator().manual_seed(3))
DTYPES = [torch.float32, torch.bfloat16]  # the step's weights (a bfloat16 model's runner takes a float32 cache with it)


def first_pass(model) -> LeanRunner:
    """A new runner of ``model`` after its first pass (on the C step: its layers released)."""
    runner = LeanRunner(model)
    runner(IDS[:, :6], 1)
    assert runner.step and released(model.model.layers[0].self_attn.q_proj)
    return runner


def reference(model) -> torch.Tensor:
    """The last 3 positions' logits by transformers' forward of a fresh model on ``model``'s weights."""
    fresh = llama(layers=2).to(torch.float32)
    fresh.load_state_dict(model.state_dict())
    with torch.no_grad():
        return fresh(IDS).logits[0, -3:]


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)  # the skinny kernel rounds apart from MKL


def test_runners_of_a_model_share_its_step_and_its_logits_bit_for_bit():
    """A second runner runs the step the first made (none made again), and computes what the first did."""
    model = llama(layers=2).to(torch.float32)
    first = first_pass(model)
    first.rollback(0)
    logits = first(IDS, 3)
    second = first_pass(model)
    assert second.step is first.step is kept_step(model)
    second.rollback(0)
    assert torch.equal(second(IDS, 3), logits)
    close(logits, reference(model))
    del first, second
    gc.collect()
    assert first_pass(model).step is kept_step(model), "the step outlives the runners while its model lives"


def _scale(weight: torch.Tensor) -> None:
    with torch.no_grad():
        weight.mul_(0.5)


def _held(model) -> None:
    with held(model):  # its own weights back for the block, released again by the next step
        pass


EDITS = {
    "output in place": lambda m: _scale(m.lm_head.weight),
    "output through .data": lambda m: m.lm_head.weight.data.mul_(0.5),  # no version bump: the values are compared
    "output replaced": lambda m: setattr(m.lm_head, "weight", torch.nn.Parameter(m.lm_head.weight.detach() * 0.5)),
    "norm replaced": lambda m: setattr(m.model.norm, "weight", torch.nn.Parameter(m.model.norm.weight.detach() * 3)),
    "norm in place": lambda m: _scale(m.model.layers[1].post_attention_layernorm.weight),
    "state dict loaded": lambda m: m.load_state_dict(llama(layers=2, seed=5).to(torch.float32).state_dict()),
    "cast and back": lambda m: m.to(torch.float64).to(torch.float32),
    "held and released": lambda m: _held(m),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_a_changed_weight_makes_a_fresh_step_on_the_new_weights(edit, monkeypatch):
    """After ``edit``, the next runner's step is a new one, and its logits are the new weights' (which
    differ from the old ones': an edit the step missed would fail here)."""
    model = llama(layers=2).to(torch.float32)
    if edit.startswith("output"):  # an output layer left the model's own (``kernels.one_head`` declines one another
        # module reads), its blocked copy made beside it: the copy whose edits the kept step must see
        import kernels.one_head

        monkeypatch.setattr(kernels.one_head, "release_head", lambda model: False)
    old = first_pass(model).step
    assert released(model.lm_head) != edit.startswith("output")
    before = reference(model)
    EDITS[edit](model)
    expected = reference(model)
    if edit not in ("cast and back", "held and released"):
        assert not torch.allclose(expected, before, rtol=1e-3, atol=1e-3), "the edit changes the logits"
    runner = first_pass(model)
    assert runner.step is not old
    runner.rollback(0)
    close(runner(IDS, 3), expected)


def test_a_model_and_its_kept_step_are_freed_together():
    """The kept step holds its model weakly, and goes with it (nothing else keeps either)."""
    model = llama(layers=2).to(torch.float32)
    first_pass(model)
    step = kept_step(model)
    assert step is not None
    refs = [weakref.ref(x) for x in (model, step, step.head, *step.keep)]
    del model, step
    gc.collect()
    assert [r for r in refs if r() is not None] == []


def test_a_restore_lets_go_of_the_kept_step_and_its_blocks():
    """A cast restores the model's own weights: the kept step (and the float32 blocks only it would
    still hold) goes at once, not at the next runner."""
    model = llama(layers=2).to(torch.float32)
    step = first_pass(model).step
    refs = [weakref.ref(x) for x in (step, *step.keep)]
    del step
    model.to(torch.float64)
    gc.collect()
    assert kept_step(model) is None and [r for r in refs if r() is not None] == []


def test_a_step_rebinds_to_a_cache_whose_keys_sit_where_anothers_did():
    """A shared step meets caches of several runners: one whose keys are where the last cache's were
    but whose values are not gets the step's writes into its own values."""
    model = llama(layers=2).to(torch.float32)
    step = first_pass(model).step
    a = new_cache(model, 16, torch.float32, torch.device("cpu"))
    b = new_cache(model, 16, torch.float32, torch.device("cpu"))
    for x, y in zip(a.layers, b.layers):
        y.keys = x.keys  # b's keys where a's are, its values its own
    step.bind(a)
    step.bind(b)
    assert [s.values for s in step.structs] == [layer.values.data_ptr() for layer in b.layers]


class _Doubled(torch.nn.Linear):
    """A linear the step does not take (not ``nn.Linear`` itself): its output doubled."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 2


def _doubled(model) -> None:
    mlp = model.model.layers[1].mlp
    made = _Doubled(mlp.down_proj.in_features, mlp.down_proj.out_features, bias=False).to(mlp.down_proj.weight.dtype)
    mlp.down_proj = made


def _eps(model) -> None:
    model.model.layers[0].input_layernorm.variance_epsilon = 0.5


REFUSED = {"a linear put in the step does not take": _doubled, "one norm's epsilon changed": _eps}


def _never_asked(monkeypatch) -> list:
    """``step_unsupported`` replaced by a recorder wherever it is bound (its module's name, and each module
    that imported it by name): the models it is asked about."""
    import sys

    import kernels.c_step

    asked, real = [], kernels.c_step.step_unsupported
    for module in [m for m in list(sys.modules.values()) if getattr(m, "step_unsupported", None) is real]:
        monkeypatch.setattr(module, "step_unsupported", lambda m: asked.append(m))
    return asked


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_runner_takes_the_kept_step_without_asking_step_unsupported_again(dtype, monkeypatch):
    """``taken_step``: a kept step still fresh is taken as it is (``step_unsupported``, a walk over every
    linear, not run again: the bulk of a generate call's Python before its first pass), by a bfloat16
    model's runner too (which decides its float32 cache by the step it takes); the same logits."""
    model = llama(layers=2).to(dtype)
    first = first_pass(model)
    first.rollback(0)
    logits = first(IDS, 3)
    asked = _never_asked(monkeypatch)
    runner = first_pass(model)
    assert runner.step is first.step and asked == []
    runner.rollback(0)
    assert torch.equal(runner(IDS, 3), logits)
    if dtype == torch.float32:
        close(logits, reference(model))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("edit", sorted(REFUSED))
def test_a_model_the_step_no_longer_takes_is_not_given_its_kept_step(edit, dtype):
    """After ``edit`` (``step_unsupported`` now finds a reason), the next runner runs the torch forward,
    not the kept step: its logits are the edited model's (the kept step's would not be); a bfloat16
    model's runner keeps its cache in bfloat16 then."""
    model = llama(layers=2).to(dtype)
    first = first_pass(model)
    first.rollback(0)
    before = first(IDS, 3)  # the kept step's logits, on the model as it was
    REFUSED[edit](model)
    with torch.no_grad():
        expected = model(IDS).logits[0, -3:].float()  # transformers' forward of the edited model
    assert not torch.allclose(expected, before, rtol=1e-3, atol=1e-3), "the edit changes the logits"
    runner = LeanRunner(model)
    logits = runner(IDS, 3)
    assert runner.step is False and runner.step_passes == 0 and runner.cache.layers[0].keys.dtype == dtype
    close(logits.float(), expected)
