"""KV-cache handling: feed a model only the tokens it has not seen, roll the cache back in place."""
import inspect
import os
import weakref

import torch
from torch import Tensor
from torch.nn import Module


def prune_cache(cache, num_tokens_to_discard: int):
    """Drop the last ``num_tokens_to_discard`` positions of a transformers ``Cache`` in place; returns it.

    Uses ``Cache.crop`` with a negative count, which means "remove that many tokens" both in
    transformers 4.x (where a positive argument is an absolute length) and 5.x (which only
    accepts negative counts).
    """
    if cache is not None and num_tokens_to_discard > 0:
        cache.crop(-num_tokens_to_discard)
    return cache


def model_device(model: Module) -> torch.device:
    """Device of the model's first parameters (where its inputs go, also with an accelerate device map)."""
    device = getattr(model, "device", None)
    if isinstance(device, torch.device):
        return device
    return next(model.parameters()).device


class PrepackedHead(Module):
    """An output projection ``y = x W^T + b`` through oneDNN with a prepacked copy of ``W``.

    On x86 CPUs, MKL computes the big vocabulary projection of a float32 model (49152 x 576 for
    SmolLM2) 2-5x slower than oneDNN with a prepacked weight, and much slower for 2-3 rows than for
    4: with it a one-token SmolLM2 step goes from ~48 to ~38 ms on the 2-core test machine. Costs
    one extra copy of the head's weight. Same result up to float32 rounding (~1e-5).
    """

    def __init__(self, head: torch.nn.Linear):
        super().__init__()
        weight = head.weight.detach()
        self.out_features = weight.shape[0]
        self.weight = weight.to_mkldnn()
        bias = head.bias.detach() if head.bias is not None else weight.new_zeros(self.out_features)
        self.bias = bias.to_mkldnn()
        self.source = (weight.data_ptr(), weight._version)

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, x.shape[-1]).contiguous().to_mkldnn()
        y = torch._C._nn.mkldnn_linear(rows, self.weight, self.bias).to_dense()
        return y.reshape(*x.shape[:-1], self.out_features)


def synchronize(model: Module) -> None:
    """Wait for the model's device, so that a clock read after it counts all the work."""
    device = model_device(model)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


_PREPACKED: "weakref.WeakKeyDictionary[Module, PrepackedHead]" = weakref.WeakKeyDictionary()


def prepacked_head(model: Module) -> tuple[str, PrepackedHead] | None:
    """(attribute name, prepacked head) for a float32 CPU model with a plain ``nn.Linear`` head, else None.

    Disabled by ``SPECDEC_FAST_HEAD=0``. Quantized, hooked (accelerate) or non-CPU heads keep the
    model's own module. The prepacked copy is remade when the head's weight changes.
    """
    if os.environ.get("SPECDEC_FAST_HEAD", "1") == "0" or not torch.backends.mkldnn.is_available():
        return None
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if get_head is not None else None
    if type(head) is not torch.nn.Linear or hasattr(head, "_hf_hook") or head._forward_hooks or head._forward_pre_hooks:
        return None
    weight = head.weight
    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        return None
    name = next((n for n, child in model.named_children() if child is head), None)
    if name is None:
        return None
    fast = _PREPACKED.get(head)
    if fast is None or fast.source != (weight.data_ptr(), weight._version):
        fast = _PREPACKED[head] = PrepackedHead(head)
    return name, fast


class KVCacheModel:
    """A model and its KV cache, for one sequence (batch size 1).

    ``model(ids, n_last)`` returns the logits ``[n_last, V]`` of the last ``n_last`` positions of
    ``ids`` (shape ``[1, L]``, any device). With the cache on, only ``ids[:, cached:]`` is fed;
    ``rollback(length)`` forgets every position from ``length`` on, so rejected drafts leave no
    trace. With the cache off, the whole of ``ids`` is fed each time (the slow reference path).

    For an encoder-decoder model, pass the encoder's ``encoder_input_ids``: the encoder runs once
    and ``ids`` are then decoder tokens. ``fast_head`` computes the output projection of a float32
    CPU model with ``PrepackedHead`` (same logits up to rounding, faster).
    """

    def __init__(
        self, model: Module, use_cache: bool = True, encoder_input_ids: list[int] | None = None, fast_head: bool = True
    ):
        self.model = model
        self.fast_head = fast_head
        self.device = model_device(model)
        self.use_cache = use_cache
        self.cache = None
        self.cached = 0  # positions held by the cache
        self.forward_passes = 0
        self.encoder_outputs = None
        if encoder_input_ids is not None:
            encoder_ids = torch.tensor([encoder_input_ids], dtype=torch.long, device=self.device)
            self.encoder_outputs = model.get_encoder()(input_ids=encoder_ids)
        params = inspect.signature(model.forward).parameters
        self._logits_to_keep = "logits_to_keep" in params

    def __call__(self, ids: Tensor, n_last: int = 1) -> Tensor:
        length = ids.shape[1]
        start = self.cached if self.use_cache else 0
        if length - start < n_last:
            raise RuntimeError(f"asked for {n_last} logits but only {length - start} positions are new")
        new = ids[:, start:length].to(self.device, non_blocking=True)
        kwargs = {"past_key_values": self.cache, "use_cache": self.use_cache}
        if self.encoder_outputs is not None:
            kwargs.update(encoder_outputs=self.encoder_outputs, decoder_input_ids=new)
        else:
            kwargs["input_ids"] = new
        if self._logits_to_keep:
            kwargs["logits_to_keep"] = n_last
        fast = prepacked_head(self.model) if self.fast_head else None
        if fast is None:
            out = self.model(**kwargs)
        else:  # the model's own forward, with the prepacked head in place of its output projection
            name, head = fast
            own = getattr(self.model, name)
            setattr(self.model, name, head)
            try:
                out = self.model(**kwargs)
            finally:
                setattr(self.model, name, own)
        self.forward_passes += 1
        if self.use_cache:
            self.cache = out.past_key_values
            self.cached = length
        return out.logits[0, -n_last:]

    def rollback(self, length: int) -> None:
        """Forget the cached positions ``length`` and after (no-op when they are not cached)."""
        if self.use_cache and self.cached > length:
            prune_cache(self.cache, self.cached - length)
            self.cached = length
