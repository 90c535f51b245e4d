"""The lean runner's one-position chain pass on its C step, decided once (``Lane``): a token of target AR (and
a drafter's or a plain step's one-position pass) re-decided at every pass which forward runs it (the hooks,
``step_for``'s plan and dtype, the step), and made a dozen small tensors around the C call (the position, the
embedding row and its float32 copy, the RoPE rows' views, their casts): about half a millisecond a pass on a
cold cache, a fifteenth of a bfloat16 pass.

A pass takes the lane only where the last pass that decided it all (``LeanRunner._run``) ran the step over one
position of a chain, and nothing it decided on has moved since, each by a counter or an identity read per pass:

* hooks: no global forward hook; no hook registered anywhere since (``RemovableHandle.next_id``: every
  registration takes an id), no layers swapped (``kernels.prepacking.SWAPS``), and no hook dict held a hook
  then (else ``HookWatch.hooked`` reads them, as every pass does);
* the plan and the dtype (``step_for``): the first ``PrepackedLinear``'s route, the same object (a
  ``set_prepack`` swaps and counts; an assigned route is another tuple); no cast, move or load of a
  prepacked layer since (``kernels.prepacking.changes``: the step's decoder layers are released,
  ``CStep.released``, so a cast of the model reaches them and counts);
* the step itself: ``CStep.current`` and ``bind`` at every pass, as ever (``kernels.step_one``);
* the embedding: read from the model's module at every pass (an ``nn.Embedding`` without ``max_norm`` or a
  released one, ``kernels.one_head``; else the full pass), copied into a float32 row of the lane's own: the
  values ``LlamaForward.embed`` gives, cast as ``CStep`` casts them (bfloat16 to float32 is exact);
* the RoPE rows: ``RopeTable.row`` (its tables' currency as ``at``'s), where the model has one table.

Anything else (a tree pass, hidden states kept, a drafter's rows, a hooked or cast model, a cache to grow)
takes the full pass, which decides again. Same C call, same arguments: the same bits as the full pass."""
from typing import Optional

import torch
from torch import Tensor, nn
import torch.nn.modules.module as torch_module
from torch.utils.hooks import RemovableHandle

import kernels.prepacking as prepacking
from kernels.blocked import BLOCK, _memory
from kernels.one_head import ReleasedEmbedding
from kernels.step_one import one_pass
from utils.module_walk import first_module

ON = True  # False: every pass decides again (the A/B of the same bits)


class Lane:
    """``LeanRunner``'s decided one-position chain pass: ``record`` after a full pass that ran the step over one
    position; ``run(token, start)``: logits ``[1, V]``, or None where the full pass must run."""

    def __init__(self, runner):
        self.runner = runner
        self.key: Optional[tuple] = None  # (the step, hooks' stamp, ``changes``, the planned layer and its route) at ``record``
        self.h = self.pairs = torch.empty(0)  # [H] float32: the fed token's embedding, overwritten by the step
        self.passes = 0  # passes it ran
        self.table = self.rows = None  # a released embedding's blocks, and their view in memory's order (``_embed``)

    def record(self) -> None:
        """After a full pass that ran the step over one position of a chain with ``hooks.hooked()`` False."""
        runner = self.runner
        step, hooks = runner.step, runner.hooks
        if not ON or not step or not step.released or hooks.busy or runner.forward.spec.embed_scale != 1.0:
            self.key = None
            return
        planned = first_module(runner.model, prepacking.PrepackedLinear)
        route = None if planned is None else planned.route
        self.key = (step, hooks.stamp, prepacking.changes(), planned, route)
        if self.h.numel() != step.dims.H:
            self.h = torch.empty(step.dims.H)
            self.pairs = self.h.view(-1, 2)  # a bfloat16 table's rows are read in pairs of features

    def run(self, ids: Tensor, start: int) -> Optional[Tensor]:
        """The pass of ``ids[0, start]`` at slot ``start`` (the runner's cache holds room for it), or None."""
        key, runner = self.key, self.runner
        if key is None or not ON or torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
            return None
        step, stamp, changes, planned, route = key
        if runner.step is not step or stamp != (prepacking.SWAPS[0], RemovableHandle.next_id) or changes != prepacking.changes() \
                or runner.hidden_layers \
                or runner.head_count or (planned is not None and planned.route is not route):
            return None
        rope = runner.ropes.row(start, runner.capacity)
        if rope is None or not self._embed(int(ids[0, start])):
            return None
        logits = one_pass(step).one(self.h.data_ptr(), rope[0], rope[1], runner.cache, start)
        self.passes += 1
        return logits

    def _embed(self, token: int) -> bool:
        """``self.h`` the embedding of ``token`` in float32, as ``LlamaForward.embed`` and ``CStep`` give it; False
        where the model's embedding is another kind, or ``token`` is out of its range (its own forward must run)."""
        # ``model.model.embed_tokens`` as ``LlamaForward.embed`` reads it, at every pass (the module dicts
        # read directly: ``Module.__getattr__`` is a Python function, a few microseconds on a cold cache)
        table = self.runner.model._modules["model"]._modules["embed_tokens"]
        kind = type(table)
        if kind is ReleasedEmbedding:  # row n: block n // 16, lane n % 16 (``kernels.one_head``)
            if not 0 <= token < table.num_embeddings:
                return False
            blocks = table.blocks
            if self.table is not blocks:  # its rows in memory's order: a bfloat16 row's features in pairs
                self.table, self.rows = blocks, _memory(blocks, blocks.dtype == torch.bfloat16)
            block, lane = divmod(token, BLOCK)
            (self.h if self.rows.dim() == 3 else self.pairs).copy_(self.rows[block, :, lane])
            return True
        if kind is not nn.Embedding or table.max_norm is not None or not 0 <= token < table.num_embeddings:
            return False
        weight = table._parameters["weight"]
        if weight is None or weight.device.type != "cpu":
            return False
        self.h.copy_(weight[token])
        return True


__all__ = ["ON", "Lane"]
