"""A runner that holds a C step follows a module or parameter replaced in its model between passes (a new
linear, a norm, an MLP, a LoRA-style wrapper): never the copies and addresses of what was replaced. What a
notebook that edits a model beside a live runner relies on."""
import pytest
import torch
from torch import nn

from kernels import prepacking, skinny
from runners import LeanRunner
from test_kernel_state import IDS, close, eager, stepped

pytestmark = [pytest.mark.needs_cc, pytest.mark.skipif(not skinny.available()[0], reason="the skinny kernel is not built here")]


def _new_down(model) -> None:
    old = model.model.layers[0].mlp.down_proj
    model.model.layers[0].mlp.down_proj = nn.Linear(old.in_features, old.out_features, bias=False)


def _new_norm(model) -> None:
    old = model.model.layers[1].input_layernorm
    new = type(old)(old.weight.shape[0], eps=old.variance_epsilon)
    new.weight.data.fill_(2.0)
    model.model.layers[1].input_layernorm = new


def _new_parameter(model) -> None:
    model.model.norm.weight = nn.Parameter(torch.full_like(model.model.norm.weight, 0.5))


def _new_mlp(model) -> None:
    other = type(model)(model.config)  # another model's MLP, its own weights
    model.model.layers[1].mlp = other.model.layers[0].mlp


class Lora(nn.Module):
    """A linear plus a rank-4 update: no ``nn.Linear``, so the C step cannot run the layer."""

    def __init__(self, base: nn.Linear):
        super().__init__()
        self.base, self.a, self.b = base, nn.Linear(base.in_features, 4, bias=False), nn.Linear(4, base.out_features, bias=False)
        nn.init.normal_(self.b.weight, std=0.5, generator=torch.Generator().manual_seed(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.b(self.a(x))


@pytest.mark.parametrize("edit", [_new_down, _new_norm, _new_parameter, _new_mlp], ids=["linear", "norm", "parameter", "mlp"])
def test_a_held_runner_computes_from_a_module_or_parameter_replaced_after_its_pass(edit):
    torch.manual_seed(1)
    model, runner = stepped()
    edit(model)
    runner.rollback(0)
    close(runner(IDS, 3), eager(model))
    assert runner.step  # the step was made again on the new weights, not dropped


def test_a_held_runner_runs_the_models_forward_once_a_layer_is_wrapped_the_step_cannot_run():
    model, runner = stepped()
    q = model.model.layers[0].self_attn.q_proj
    base = nn.Linear(q.in_features, q.out_features, bias=False)
    base.weight.data.copy_(q.weight)
    model.model.layers[0].self_attn.q_proj = Lora(base)
    with torch.no_grad():
        expected = model(IDS).logits[0, -3:]
    runner.rollback(0)
    close(runner(IDS, 3), expected)
    assert runner.step is False  # one line of reason is the new runner's header's; this one simply runs torch
    close(LeanRunner(model)(IDS, 3), expected)


def test_a_forward_that_builds_containers_of_the_layers_changes_nothing_a_step_compares():
    """transformers' forward slices its ``ModuleList`` at every pass (a new list of the same layers): counted as
    a change, every step would read its whole model again at each pass."""
    model, runner = stepped()
    before = prepacking.changes()
    with torch.no_grad():
        model(IDS)
    nn.ModuleList(list(model.model.layers))
    assert prepacking.changes() == before
