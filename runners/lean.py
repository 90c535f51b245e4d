"""``LeanRunner``: the Llama family's own forward and its kin's (``models.llama``, as ``models.layer_spec``
describes each model) over a static KV cache it owns,
behind the ``runners.base.Runner`` interface; the default eager runner of the models it covers
(``lean_unsupported``: why another model keeps transformers' forward in ``KVCacheModel``).

A float32 or bfloat16 CPU pass runs the C step (``kernels.c_step``: the whole pass in one C call, on
the skinny kernel) where the model's kernel plan runs that pass width on the skinny kernel, or where
the model has no plan (as loaded: ``step_for``); every other pass runs ``models.llama``'s torch forward
over the model's own modules, on their plan. The KV cache is in the model's own dtype, which both
forwards read and write: the step computes in float32 and rounds a bfloat16 model's keys and values
to bfloat16 once where it writes them (``kernels/attention.h``). A pass of a model with
forward hooks (``runners.hooks``, checked at every pass) runs transformers' own forward into the same
cache, so that every hook fires."""
from typing import Optional

import torch
from torch import Tensor
from torch.nn import Module

from kernels.c_step import CStep, StepRefused, step_for
from kernels import huge_pages
from kernels.head_rows import HeadRows, kept_rows, wide_buffer
from kernels.prompt_gemm import MANY_ROWS
from kernels.step_pool import taken_step
from models.llama import KVCache, LlamaForward, lean_unsupported, new_cache, window_seen
from runners.config import lean_label
from runners.device import model_device
from runners.hooks import HookWatch, transformers_pass
from runners.lean_lane import Lane
from runners.rope_table import RopeTable
from runners.static import fed, grown_capacity
from runners.trees import TreePasses, compute_dtype
from utils.models import end_tokens


class LeanRunner(TreePasses):
    """A ``runners.Runner`` over ``models.llama.LlamaForward``: ``runner(ids, n_last)`` returns the
    logits ``[n_last, V]`` of the last ``n_last`` positions of ``ids`` ``[1, L]``, feeding only
    ``ids[:, cached:]``; ``rollback(length)`` only moves the write position back (a pass attends to
    the slots before its own end, so stale ones are never read). The cache holds the first pass's
    length plus ``runners.static.STATIC_SLACK`` positions, regrown by doubling (copying what it
    holds). Tree passes (``TreePasses``) attend over the slots ``< cur + N`` with the tree mask."""

    cache_kind = "static"
    use_cache = True

    def __init__(self, model: Module):
        self.forward = LlamaForward(model)  # refuses a model outside the family, with its reason
        self.model = model
        self.device = model_device(model)
        self.dtype = compute_dtype(model)
        self.cache: Optional[KVCache] = None
        self.capacity = 0
        self.cached = 0
        self.forward_passes = 0
        self.hidden_layers: tuple = ()  # runners.base.Runner: hidden states kept with each pass
        self.hidden: Optional[Tensor] = None
        self.hidden_start = 0
        # taken at the first pass that runs it (``step_for``): the model's one step, checked (``kernels.step_pool``); False: it cannot
        self.step: Optional[CStep] | bool = None
        self.step_passes = 0  # passes the step ran (the rest ran the torch forward)
        self.hooks = HookWatch(model)
        self.hooked_passes = 0  # passes run on transformers' forward, the model having hooks then
        self.ropes = RopeTable(model, self.forward.spec)  # the step's RoPE rows, made once (``runners.rope_table``)
        self.head_count = 0  # a drafter's: its C step passes compute this many output rows and its tokens' (``output_rows``)
        self.fed_tokens: set = set()  # every token fed while ``head_count`` is set (the rows it adds)
        self.wide: Optional[Tensor] = None  # with ``head_count``: the [n, V] logits a pass returns, reused (``wide_buffer``)
        self.lane = Lane()  # a chain pass of 1..12 positions on the step, decided once (``runners.lean_lane``)

    def __call__(self, ids: Tensor, n_last: int = 1) -> Tensor:
        length, start = ids.shape[1], self.cached
        rows = length - start
        # decoding's pass and a verification pass of a chain (2..12 positions): decided once (``Lane``)
        if 1 <= n_last <= rows <= MANY_ROWS and length <= self.capacity:
            logits = self.lane.run(self, ids, start, rows, n_last)
            if logits is not None:
                self.cached, self.step_passes, self.forward_passes = length, self.step_passes + 1, self.forward_passes + 1
                return logits
        new = fed(self, ids, n_last)[0]
        positions = torch.arange(start, length, device=self.device)
        passes = self.step_passes
        logits = self._run(new, positions, start, n_last, None)
        self.cached = length
        if self.step_passes > passes:  # the step ran a chain (a prompt's too): the lane may run the next
            self.lane.record(self)
        return logits

    def rollback(self, length: int) -> None:
        """Forget the cached positions ``length`` and after (no-op when they are not cached)."""
        if self.cached > length:
            self.cached = length

    def _reserve(self, length: int) -> None:
        """Make the cache hold ``length`` positions: allocate it, or regrow it (copying what it holds)."""
        if length <= self.capacity:
            return
        capacity = grown_capacity(length, self.capacity)
        if self.cache is None:  # the model's dtype now (cast since this runner was made)
            self.dtype = compute_dtype(self.model)
        cache = new_cache(self.model, capacity, self.dtype, self.device, huge_pages.empty)  # on 2 MB pages (huge_pages.CACHE)
        if self.cache is not None:
            for old, new in zip(self.cache.layers, cache.layers):
                new.keys[:, :, : self.cached].copy_(old.keys[:, :, : self.cached])
                new.values[:, :, : self.cached].copy_(old.values[:, :, : self.cached])
        self.cache, self.capacity = cache, capacity

    @torch.no_grad()
    def _run(self, ids: Tensor, positions: Tensor, start: int, n_last: int, mask: Optional[Tensor]) -> Tensor:
        """One pass of ``ids`` ``[r]`` at ``positions`` into slots ``start..``; logits ``[n_last, V]``."""
        new = self._fed(ids)  # a drafter's rows hold every token fed, whichever forward runs it
        if self.hooks.hooked():
            self._torch_cache()
            logits, hidden = transformers_pass(self.model, ids, positions, self.cache, start, n_last, mask, self.hidden_layers)
            self.hooked_passes += 1
            self._passed(hidden, start)
            return logits
        use = self.step is not False and step_for(self.model, ids.shape[0], unsupported=False)
        if use and self.step is None:  # the first pass that runs it: whether it can, once
            self.step = taken_step(self.model) or False
        if use and self.step:
            h = self.forward.embed(ids)  # [r, H]
            cos, sin = self.ropes.at(positions, start if mask is None else None, self.capacity)  # [T, r, R], kept rows
            head = self._head_rows(new)
            try:
                logits, hidden = self.step(h, (cos, sin), self.cache, start, self._seen(mask, positions, start), n_last, self.hidden_layers, head)
            except StepRefused:  # the model changed into one the step cannot run (a layer replaced): its own forward from now on
                self._torch_cache()
                self.step = False
                return self._run(ids, positions, start, n_last, mask)
            if head is not None:  # [n_last, V]: minus infinity past its rows, in this runner's buffer (valid until its next pass)
                self.wide = wide_buffer(self.wide, n_last, head.vocab, logits.dtype)
                logits = head.full(logits, self.wide[:n_last])
            self.step_passes += 1
        else:
            self._torch_cache()
            logits, hidden = self.forward(ids, positions, self.cache, start, n_last, mask, self.hidden_layers)
        self._passed(hidden, start)
        return logits

    def output_rows(self, count: int) -> Optional[int]:
        """For a drafter only (``drafters.model``): from now on, a pass the C step runs computes the logits of ids
        ``0..count-1`` (BPE's most frequent), of every token this runner is fed from then on (the prompt, the
        output so far) and of the model's end tokens, minus infinity for the rest (``kernels.head_rows``). 0 (or
        the whole vocabulary): every row. Returns the rows it will compute before any token (None: every row,
        the C step not running this model's passes). Such a pass returns its ``[n, V]`` logits in a buffer this
        runner reuses (no allocation a pass): valid until its next pass, as a drafter reads them."""
        self.head_count, self.fed_tokens = count, set(end_tokens(self.model, None))
        if count <= 0 or count >= self.model.get_output_embeddings().out_features:
            self.head_count = 0
        if self.step is None and step_for(self.model, 1, unsupported=False):
            self.step = False if self.hooks.hooked() else taken_step(self.model) or False
        return kept_rows(self.step.head, self.step.vocab, count).count if self.head_count and self.step else None

    def _fed(self, ids: Tensor) -> set:
        """With ``head_count``: the tokens of ``ids`` (fed now, on whichever forward) not fed before, now counted."""
        if not self.head_count:
            return set()
        new = set(ids.tolist()) - self.fed_tokens
        self.fed_tokens |= new
        return new

    def head_for(self, ids: Tensor) -> Optional[HeadRows]:
        """The output rows a C step pass over ``ids`` ``[r]`` computes (None: all), those tokens counted as fed (the lane's pass)."""
        return self._head_rows(self._fed(ids))

    def _head_rows(self, new: set) -> Optional[HeadRows]:
        """The output rows this C step pass computes (None: all), holding every token fed (``new``: those not yet added)."""
        if not self.head_count:
            return None
        rows = kept_rows(self.step.head, self.step.vocab, self.head_count)
        if not rows.owned_by(self):  # another runner's tokens, or a new copy (the model changed): this one's own again
            rows.take(self, self.fed_tokens)
        elif new:
            rows.add(new)
        return rows

    def _torch_cache(self) -> None:
        """Before a torch pass: the cache in the model's own dtype (cast where the model was cast since it was
        made, what it holds rounded where narrowed), and from then on no C step where it was cast."""
        own = compute_dtype(self.model)
        if self.cache is not None and self.dtype != own:
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys.to(own), layer.values.to(own)
            self.dtype, self.step = own, False

    def _seen(self, mask: Optional[Tensor], positions: Tensor, start: int) -> Optional[Tensor]:
        """A tree pass's ``mask`` as the C step reads it: what the rows see ``[r, start + r]``, and with
        sliding layers, what they see in their window too ``[2, r, start + r]``; None: a chain."""
        if mask is None:
            return None
        end = start + positions.shape[0]
        seen = mask[0, 0, :, :end] if mask.dtype == torch.bool else mask[0, 0, :, :end] == 0
        windows = self.forward.spec.windows
        return torch.stack([seen, window_seen(seen, positions, start, windows[0])]) if windows else seen

    def _passed(self, hidden: Optional[Tensor], start: int) -> None:
        self.forward_passes += 1
        if self.hidden_layers:
            self.hidden, self.hidden_start = hidden, start

    # ---- draft trees (``TreePasses``): the tree's mask spans the slots < cur + N ----
    def _tree_refusal(self) -> Optional[str]:
        """None: the lean forward takes every model it runs through a tree (its sliding layers' windows
        drawn into the tree's mask by position, its cache keeping every layer's full length)."""
        return None

    def _tree_room(self, length: int) -> int:
        self._reserve(length)
        return length

    def _tree_forward(self, kwargs: dict, start: int, n: int) -> Tensor:
        """Logits ``[1 + n, V]`` of the tree pass ``kwargs`` (``runners.trees.tree_inputs``) from ``start``."""
        ids, positions = kwargs["input_ids"][0], kwargs["position_ids"][0]
        return self._run(ids, positions, start, n + 1, kwargs["attention_mask"])


__all__ = ["LeanRunner", "lean_label", "lean_unsupported"]
