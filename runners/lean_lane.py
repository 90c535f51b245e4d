"""The lean runner's chain pass of 1..12 positions on its C step, decided once (``Lane``): a token of target AR (and
a drafter's or a plain step's one-position pass), and since 2026-12-01 a drafting row's verification pass (the last
token and up to 11 drafts, ``sampling.chain_decoding.draft_and_verify``), re-decided at every pass which forward runs
it (the hooks, ``step_for``'s plan and dtype, the step), and made a dozen small tensors around the C call (the
positions, the embedding rows and their float32 copy, the RoPE rows' views, their casts): about half a millisecond
a pass on a cold cache, a fifteenth of a bfloat16 pass, 3-5% of a verification pass.

A pass takes the lane only where the last pass that decided it all (``LeanRunner._run``) ran the step over a chain
(any width: one position, a verification pass, a prompt; a lane pass records nothing, so passes of changing widths
run on one record), and nothing it decided on has moved since, each by a counter or an identity read per pass:

* hooks: no global forward hook; no hook registered anywhere since (``RemovableHandle.next_id``: every
  registration takes an id), no layers swapped (``kernels.prepacking.SWAPS``), and the hook dicts that held
  hooks then (none of them the user's: transformers' own, the pass clock's) hold as many (``HookWatch``'s test);
* the plan and the dtype (``step_for``): the first ``PrepackedLinear``'s route, the same object (a
  ``set_prepack`` swaps and counts; an assigned route is another tuple), and the pass's width one that route
  sends to the step (``step_widths``, read at ``record``: a width on "own" or "prepacked" takes the full pass,
  and with it the torch forward); no cast, move or load of a
  prepacked layer since (``kernels.prepacking.changes``: the step's decoder layers are released,
  ``CStep.released``, so a cast of the model reaches them and counts);
* the step itself: ``CStep.current`` and ``bind`` at every pass, as ever (``kernels.step_one``);
* the embedding: read from the model's module at every pass (an ``nn.Embedding`` without ``max_norm`` or a
  released one, ``kernels.one_head``; else the full pass), its rows gathered in C from the int64 ids where they
  lie into float32 rows of the lane's own (``kernels/step_embed.c``, each token checked against the table's
  rows): the values ``LlamaForward.embed`` gives, cast as ``CStep`` casts them (bfloat16 to float32 is exact);
* the RoPE rows: ``RopeTable.row`` (its tables' currency as ``at``'s, grown to the chain's end), where the model
  has one table.

A learned head's row keeps its hidden states ``[rows, n H]`` from the same call (``OnePass.one``'s ``layers``), as the
full pass does: a paused head's step then costs target AR's pass. The logits of the last ``n_last`` rows come back
with each row's top read in the same call (``with_tops``), as the full pass returns them. A drafter's cut output
layer (``kernels.head_rows``, ``--drafter-head``) since 2026-12-01 too: its rows' logits, no tops, spread over the
vocabulary in the runner's buffer, as the full pass does (they had taken the full pass: a drafter pass's host
work 1.00 against 0.78 ms on the lane, medians, one thread on a busy machine, noisy; docs/results.md). Anything
else (a tree pass, a drafter's rows with a learned head's states, a hooked or cast model, a cache to grow, more
than 12 positions) takes the full pass, which decides again. Same C call, same arguments (one chunk, decoding's loop: ``tile`` 0 up to 12 rows): the same bits as
the full pass (``tests/test_lean_lane_chain.py``)."""
import ctypes
import weakref
from typing import Optional

import torch
from torch import Tensor, nn
import torch.nn.modules.module as torch_module
from torch.utils.hooks import RemovableHandle

import kernels.prepacking as prepacking
from kernels.head_rows import wide_buffer
from kernels.one_head import ReleasedEmbedding
from kernels.prepacking import SKINNY
from kernels.prompt_gemm import MANY_ROWS
from kernels.step_one import one_pass
from utils.module_walk import first_module

ON = True  # False: every pass decides again (the A/B of the same bits)
ROWS, BLOCKS = 0, 2  # ``kernels/step_embed.c``'s kinds of table, plus ``KINDS`` of its dtype
KINDS = {torch.float32: 0, torch.bfloat16: 1}
_P, _I = ctypes.c_void_p, ctypes.c_int64


def step_widths(route: Optional[tuple]) -> frozenset:
    """The pass widths 1..``MANY_ROWS`` that ``step_for`` sends to the C step under the plan ``route`` (None: every one)."""
    return frozenset(w for w in range(1, MANY_ROWS + 1) if route is None or route[w - 1 if w < len(route) else 0] == SKINNY)


class Lane:
    """``LeanRunner``'s decided chain pass: ``record`` after a full pass that ran the step over a chain of
    1..``MANY_ROWS`` positions; ``run(runner, ids, start, rows, asked)``: logits ``[asked, V]``, or None where the full
    pass must run."""

    def __init__(self):
        self.key: Optional[tuple] = None  # (the step, hooks' stamp, ``changes``, the planned layer and its route) at ``record``
        self.widths: frozenset = frozenset()  # the widths the route sends to the step (``step_widths``), at ``record``
        self.h = torch.empty(0)  # [MANY_ROWS, H] float32: the fed tokens' embeddings, overwritten by the step
        self.gather = self.library = None  # ``c_step_embed_rows`` of the step's library, its argtypes declared
        self.passes = 0  # passes it ran
        self.layers: tuple = ((), None)  # (the runner's hidden layers, them as ``CStep.__call__``'s int64 ``at``)

    def record(self, runner) -> None:
        """After a full pass of ``runner`` that ran the step over a chain of 1..``MANY_ROWS`` positions with
        ``hooks.hooked()`` False (the runner is passed, never held: no cycle, so a runner and its model go by
        reference count, as before)."""
        step, hooks = runner.step, runner.hooks
        if not ON or not step or not step.released or runner.forward.spec.embed_scale != 1.0:
            self.key = None
            return
        planned = first_module(runner.model, prepacking.PrepackedLinear)
        route = None if planned is None else planned.route
        # the step and the planned layer weakly: a layer swapped out (a measurement's next option) or a step let go
        # must not be kept alive by a key that only compares them (a first start's measurement held 4x its weights)
        self.key = (weakref.ref(step), hooks.stamp, prepacking.changes(), None if planned is None else weakref.ref(planned), route)
        self.widths = step_widths(route)  # read under this route alone: the key compares it, the same tuple
        if self.h.shape != (MANY_ROWS, step.dims.H):
            self.h = torch.empty((MANY_ROWS, step.dims.H))
        if self.gather is None or self.library is not step.library:
            self.gather, self.library = step.library["c_step_embed_rows"], step.library  # its own function object
            self.gather.argtypes, self.gather.restype = [_P, _I, _P, _I, _I, _I, _P], _I

    def run(self, runner, ids: Tensor, start: int, rows: int = 1, asked: int = 1) -> Optional[Tensor]:
        """``runner``'s chain pass of ``ids[0, start:start + rows]`` at slots ``start..`` (its cache holds room for them),
        the logits of the last ``asked``; or None."""
        key = self.key
        if key is None or not ON or rows not in self.widths or torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
            return None
        step, stamp, changes, planned, route = key
        step, planned = step(), planned and planned()
        if step is None or runner.step is not step or stamp != (prepacking.SWAPS[0], RemovableHandle.next_id) or changes != prepacking.changes() \
                or (key[3] is not None and (planned is None or planned.route is not route)) \
                or (runner.head_count and runner.hidden_layers):  # a drafter's rows and a head's states: the full pass
            return None
        hooks = runner.hooks  # dicts that held hooks none of which counts (transformers' own, the pass clock's): one removed?
        if hooks.busy and [len(h) for h in hooks.busy] != hooks.lengths:
            return None
        rope = runner.ropes.row(start, runner.capacity, rows)
        if rope is None or not self._embed(runner.model, ids, start, rows):
            return None
        # a drafter's rows, every fed token's among them (counted here, past every refusal: a refused pass's full
        # pass counts them itself), spread over the vocabulary as the full pass spreads them
        head = runner.head_for(ids[0, start:start + rows]) if runner.head_count else None
        layers = runner.hidden_layers
        if head is not None:
            logits = one_pass(step).drafted(self.h.data_ptr(), rope, runner.cache, start, rows, asked, head)
            runner.wide = wide_buffer(runner.wide, asked, head.vocab, logits.dtype)
            logits = head.full(logits, runner.wide[:asked])
        elif not layers:
            logits = one_pass(step).one(self.h.data_ptr(), rope, runner.cache, start, None, None, rows, asked)
        else:  # a learned head's row: its hidden states in the same call, as the full pass keeps them (``_passed``)
            if self.layers[0] != layers:
                self.layers = (layers, torch.tensor(list(layers), dtype=torch.int64))
            hidden = torch.empty((rows, len(layers) * self.h.shape[1]))  # kept by the runner past this pass (the head reads it)
            logits = one_pass(step).one(self.h.data_ptr(), rope, runner.cache, start, self.layers[1], hidden, rows, asked)
            runner.hidden, runner.hidden_start = hidden, start
        self.passes += 1
        return logits

    def _embed(self, model, ids: Tensor, start: int, rows: int) -> bool:
        """``self.h[:rows]`` the embeddings of ``ids[0, start:start + rows]`` in float32, as ``LlamaForward.embed`` and
        ``CStep`` give them (gathered in C from where the ids lie, ``kernels/step_embed.c``: exact); False where the
        model's embedding is another kind, the ids are not int64 rows in CPU memory, or a token is out of the
        table's range (its own forward must run)."""
        # ``model.model.embed_tokens`` as ``LlamaForward.embed`` reads it, at every pass (the module dicts
        # read directly: ``Module.__getattr__`` is a Python function, a few microseconds on a cold cache)
        table = model._modules["model"]._modules["embed_tokens"]
        kind = type(table)
        if kind is ReleasedEmbedding:  # row n: block n // 16, lane n % 16 (``kernels.one_head``)
            source, kind = table.blocks, BLOCKS
        elif kind is nn.Embedding and table.max_norm is None:
            source, kind = table._parameters["weight"], ROWS
        else:
            return False
        if source is None or source.dtype not in KINDS or source.device.type != "cpu" or not source.is_contiguous() \
                or ids.dtype != torch.int64 or ids.device.type != "cpu" or ids.stride(1) != 1:
            return False
        tokens = ids.data_ptr() + start * 8  # ids[0, start]: a row's ids lie one int64 apart
        return self.gather(source.data_ptr(), kind + KINDS[source.dtype], tokens, rows, table.num_embeddings, self.h.shape[1],
                           self.h.data_ptr()) == 0


__all__ = ["ON", "Lane", "step_widths"]
