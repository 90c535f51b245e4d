"""KV-cache handling: feed a model only the tokens it has not seen, roll the cache back in place."""
import contextlib
import inspect
import os
import weakref
from typing import Dict, List, Tuple

import torch
from torch import Tensor
from torch.nn import Module


def prune_cache(cache, num_tokens_to_discard: int):
    """Drop the last ``num_tokens_to_discard`` positions of a KV cache; returns the pruned cache.

    A transformers ``Cache`` (``DynamicCache``, ``EncoderDecoderCache``, ...) is cropped in place
    with ``Cache.crop`` and a negative count, which means "remove that many tokens" both in
    transformers 4.x (where a positive argument is an absolute length) and 5.x (which only
    accepts negative counts). A legacy tuple cache gets a new, shorter tuple
    (``prune_tuple_cache``). ``None`` stays ``None``; 0 tokens leaves the cache as it is.
    """
    if cache is None:
        return None
    if isinstance(cache, (tuple, list)):
        return prune_tuple_cache(cache, num_tokens_to_discard)
    if not hasattr(cache, "crop"):
        raise ValueError(f"Unsupported cache type: {type(cache).__name__}")
    if num_tokens_to_discard > 0:
        cache.crop(-num_tokens_to_discard)
    return cache


def prune_tuple_cache(cache, num_tokens_to_discard: int):
    """Prune a legacy tuple cache (one tuple per layer of 2 tensors, or 4 for an encoder-decoder:
    self-attention keys and values, then cross-attention keys and values; each
    ``[batch, heads, positions, head_dim]``): a new tuple without the last ``num_tokens_to_discard``
    positions of the self-attention tensors. The cross-attention tensors hold the encoder's
    positions and are kept whole (the reference cut them too), and 0 tokens keeps everything
    (the reference's ``[:-0]`` emptied the cache)."""
    if cache is None:
        return None
    keep = None if num_tokens_to_discard <= 0 else -num_tokens_to_discard
    pruned = []
    for layer in cache:
        if layer is None:
            pruned.append(None)
            continue
        pruned.append(tuple(t[:, :, :keep, :] if i < 2 else t for i, t in enumerate(layer)))
    return tuple(pruned)


def prune_dynamic_cache(cache, num_tokens_to_discard: int):
    """Prune a ``DynamicCache`` in place (``Cache.crop``) and return the same instance."""
    if cache is None:
        return None
    return prune_cache(cache, num_tokens_to_discard)


def model_device(model: Module) -> torch.device:
    """Device of the model's first parameters (where its inputs go, also with an accelerate device map)."""
    device = getattr(model, "device", None)
    if isinstance(device, torch.device):
        return device
    return next(model.parameters()).device


def synchronize(model: Module) -> None:
    """Wait for the model's device, so that a clock read after it counts all the work."""
    device = model_device(model)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


# oneDNN's blocked weight layout is chosen for passes of this many rows (verification passes);
# whether prepacking pays at all is measured on the machine that runs it (``choose_kernels``).
_ROW_HINT = 8


class PrepackedLinear(Module):
    """A float32 CPU ``nn.Linear`` computed by oneDNN from a copy of its weight reordered once.

    Where MKL is slow (it repacks weights at every call on some x86 CPUs, and takes a generic path
    on others) this halves a float32 step; where it is not, oneDNN's path is slower. So it is a
    per-machine choice, measured at start-up (``sampling.calibration.choose_kernels``), never a
    default. Same result up to float32 rounding (~1e-5); costs one extra copy of the weights.
    ``set_prepack`` makes it the model's own module, so every caller (our runners and
    transformers' ``generate``) runs the same kernel.
    """

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        # the layer's own parameters stay reachable, for model code that reads .weight or .bias
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.linear = [linear]  # the module it replaces (a list: not a submodule, no second state_dict entry)
        self._pack()

    def _pack(self) -> None:
        self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), _ROW_HINT)
        self.packed_bias = self.bias.detach() if self.bias is not None else None
        self.source = _source(self.linear[0])

    def forward(self, x: Tensor) -> Tensor:
        if self.weight._version != self.source[0][1]:  # the weights were changed in place since packing
            self._pack()
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, self.packed_bias, "none", [], "")


def _source(linear: torch.nn.Linear) -> tuple:
    """What identifies the current values of a linear layer's parameters."""
    return tuple((p.data_ptr(), p._version) for p in (linear.weight, linear.bias) if p is not None)


def _can_prepack() -> bool:
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        return bool(torch.ops.mkldnn._reorder_linear_weight and torch.ops.mkldnn._linear_pointwise)
    except (AttributeError, RuntimeError):
        return False


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def prepack_fits(size: int) -> bool:
    """Whether float32 linear layers of ``size`` bytes would be prepacked (``prepackable``'s limits)."""
    return _can_prepack() and 0 < size <= _physical_memory() // 4


_PREPACKED: "weakref.WeakKeyDictionary[Module, PrepackedLinear]" = weakref.WeakKeyDictionary()

# (the parent's submodule dict, the child's name, the prepacked layer, the model's own layer)
Swap = Tuple[Dict[str, Module], str, PrepackedLinear, torch.nn.Linear]


def prepackable(model: Module) -> List[Swap]:
    """The model's float32 CPU linear layers (its own or already prepacked) with their prepacked
    copies; [] when none could be prepacked: without oneDNN, or when the copies would take more
    than a quarter of the machine's memory. Quantized, hooked (accelerate) or non-CPU layers, and
    other dtypes, never are. A copy is remade when its layer's parameters change."""
    if not _can_prepack():
        return []
    found = []
    for parent in model.modules():
        for name, child in parent._modules.items():
            own = child.linear[0] if type(child) is PrepackedLinear else child
            if type(own) is not torch.nn.Linear or hasattr(own, "_hf_hook") or own._forward_hooks or own._forward_pre_hooks:
                continue
            if own.weight.device.type != "cpu" or own.weight.dtype != torch.float32:
                continue
            found.append((parent._modules, name, own))
    size = sum(own.weight.numel() * 4 for _, _, own in found)
    if not found or size > _physical_memory() // 4:
        return []
    swaps = []
    for modules, name, own in found:
        packed = modules[name] if type(modules[name]) is PrepackedLinear else _PREPACKED.get(own)
        if packed is None or packed.source != _source(own):
            packed = PrepackedLinear(own)
        _PREPACKED[own] = packed
        swaps.append((modules, name, packed, own))
    return swaps


def set_prepack(model: Module, on: bool) -> bool:
    """Make the model's float32 CPU linear layers ``PrepackedLinear`` (``on``) or its own
    ``nn.Linear`` again; returns whether they are prepacked now (False where ``prepackable`` finds
    nothing). The modules themselves change: every caller of the model, transformers' ``generate``
    included, runs what this chose, and ``prepacked(model)`` reads it back. Plain dict writes:
    ``Module.__setattr__`` on 200 layers costs about a millisecond."""
    swaps = prepackable(model) if on or prepacked(model) else []
    for modules, name, packed, own in swaps:
        modules[name] = packed if on else own
    return bool(on and swaps)


def prepacked(model: Module) -> bool:
    """Whether ``model``'s linear layers are prepacked (``set_prepack``): read from its modules."""
    return any(type(m) is PrepackedLinear for m in model.modules())


@contextlib.contextmanager
def kernels(model: Module, prepack: bool | None):
    """``model`` with its linear layers prepacked or its own (None: as they are) for the block, then as before."""
    before = prepacked(model) if prepack is not None else None
    if prepack is not None and prepack != before:
        set_prepack(model, prepack)
    try:
        yield model
    finally:
        if prepack is not None and prepack != before:
            set_prepack(model, before)


def drop_prepacked(model: Module) -> None:
    """Put the model's own linear layers back and free their prepacked copies (after a measurement chose them)."""
    set_prepack(model, False)
    for layer in model.modules():
        _PREPACKED.pop(layer, None)


def _rollback_capable_cache(model: Module):
    """The model's own dynamic cache (sliding-window layers included), recording past states so
    that a rollback may reach behind a sliding window: such a layer keeps what it has seen until
    the next ``crop``, which then cuts it back to its window. None lets the model make its own."""
    try:
        from transformers import DynamicCache

        cache = DynamicCache(config=model.config)
    except (ImportError, TypeError, ValueError, AttributeError):
        return None
    cache.activate_past_recording()
    return cache


CACHES = ("static", "dynamic")
# The CPU default, chosen by measurement (README, "CPU weights that read fewer bytes, and the static
# cache": the static cache measured no faster on CPU); CUDA defaults to static (unmeasured).
DEFAULT_CPU_CACHE = "dynamic"
_STATIC_SLACK = 256  # positions preallocated beyond the first pass (new tokens, verification passes)
_STATIC_ROUND = 128


def set_cache(model: Module, cache: str | None) -> None:
    """Which KV cache every runner of ``model`` uses from now on: "static", "dynamic", or None (the
    default: static on CUDA, ``DEFAULT_CPU_CACHE`` on CPU). The REPL's and the benchmark's ``--cache``."""
    if cache is not None and cache not in CACHES:
        raise ValueError(f"cache must be one of {CACHES}, got {cache!r}")
    model._specdec_cache = cache


def default_cache(model: Module) -> str:
    """The cache a runner of ``model`` uses when none is named."""
    chosen = getattr(model, "_specdec_cache", None)
    if chosen is not None:
        return chosen
    return "static" if model_device(model).type == "cuda" else DEFAULT_CPU_CACHE


def runner_cache(model: Module, cache: str | None = None) -> str:
    """The cache a runner of ``model`` starts with: ``cache``, else ``default_cache(model)``; the
    dynamic one for encoder-decoder models and models whose forward takes no ``position_ids``."""
    static_possible = not getattr(model.config, "is_encoder_decoder", False) and "position_ids" in inspect.signature(model.forward).parameters
    return (cache or default_cache(model)) if static_possible else "dynamic"


def _static_cache(model: Module, capacity: int):
    """transformers' ``StaticCache`` for ``capacity`` positions, or None when the model cannot take one.

    Every layer is a full-length ``StaticLayer``, sliding-window layers included: the model's
    sliding-window mask (from absolute positions) still limits what such a layer attends to,
    while a rollback, which only moves the write position back, never needs a position that a
    ring buffer would have overwritten."""
    try:
        from transformers import StaticCache
        from transformers.cache_utils import StaticLayer

        config = model.config.get_text_config(decoder=True)
        cache = StaticCache(config=config, max_cache_len=capacity)
    except (ImportError, TypeError, ValueError, AttributeError, KeyError):
        return None
    for i, layer in enumerate(cache.layers):
        if type(layer) is not StaticLayer:
            if not getattr(layer, "is_sliding", False):
                return None  # linear attention, indexed layers...: not a plain K/V store
            cache.layers[i] = StaticLayer(max_cache_len=capacity)
    return cache


def _round_up(value: int, step: int) -> int:
    return -(-value // step) * step


class KVCacheModel:
    """A model and its KV cache, for one sequence (batch size 1).

    ``model(ids, n_last)`` returns the logits ``[n_last, V]`` of the last ``n_last`` positions of
    ``ids`` (shape ``[1, L]``, any device). With the cache on, only ``ids[:, cached:]`` is fed;
    ``rollback(length)`` forgets every position from ``length`` on, so rejected drafts leave no
    trace. With the cache off, the whole of ``ids`` is fed each time (the slow reference path).

    ``cache``: "static" preallocates the keys and values (transformers' ``StaticCache``, for the
    first pass's length plus 256 positions, regrown by doubling when a generation goes further),
    writes each pass at its positions and rolls back by moving the write position (no crop, no
    concatenation); "dynamic" is the model's own ``DynamicCache`` (recording past states, so a
    rollback reaches behind a sliding window). None: ``default_cache(model)`` (``set_cache``).
    Encoder-decoder models, and models whose cache is not a plain K/V store, use the dynamic cache.

    For an encoder-decoder model, pass the encoder's ``encoder_input_ids``: the encoder runs once
    and ``ids`` are then decoder tokens. The runner runs the model's modules as they are: its
    kernels (``set_prepack``, quantization) are the model's, the same for every caller.
    """

    def __init__(
        self, model: Module, use_cache: bool = True, encoder_input_ids: list[int] | None = None,
        cache: str | None = None,
    ):
        if cache is not None and cache not in CACHES:
            raise ValueError(f"cache must be one of {CACHES}, got {cache!r}")
        self.model = model
        self.cache_kind = runner_cache(model, cache)
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
        self.capacity = 0  # positions preallocated by a static cache

    def __call__(self, ids: Tensor, n_last: int = 1) -> Tensor:
        length = ids.shape[1]
        start = self.cached if self.use_cache else 0
        if length - start < n_last:
            raise RuntimeError(f"asked for {n_last} logits but only {length - start} positions are new")
        new = ids[:, start:length].to(self.device, non_blocking=True)
        if self.use_cache and self.cache_kind == "static":
            self._reserve(length)
        if self.use_cache and self.cache is None and self.encoder_outputs is None:
            self.cache = _rollback_capable_cache(self.model)
        kwargs = {"past_key_values": self.cache, "use_cache": self.use_cache}
        if self.capacity:  # static: positions are given, the write position is the cache's own
            kwargs["position_ids"] = torch.arange(start, length, device=self.device).unsqueeze(0)
        if self.encoder_outputs is not None:
            kwargs.update(encoder_outputs=self.encoder_outputs, decoder_input_ids=new)
        else:
            kwargs["input_ids"] = new
        if self._logits_to_keep:
            kwargs["logits_to_keep"] = n_last
        out = self._forward(kwargs)
        if self.use_cache:
            self.cache = out.past_key_values
            self.cached = length
        return out.logits[0, -n_last:]

    def _reserve(self, length: int) -> None:
        """Make the static cache hold ``length`` positions: allocate it, or regrow it (copying what it holds)."""
        if length <= self.capacity:
            return
        capacity = _round_up(max(length + _STATIC_SLACK, 2 * self.capacity), _STATIC_ROUND)
        cache = _static_cache(self.model, capacity)
        if cache is None:
            self.cache_kind = "dynamic"  # the model's own dynamic cache from here on
            return
        if self.cache is not None:
            if self.capacity == 0:  # dynamic states from before (cannot happen with a fixed kind)
                raise RuntimeError("a runner cannot switch to a static cache mid-generation")
            for old, new in zip(self.cache.layers, cache.layers):
                if old.is_initialized:
                    new.lazy_initialization(old.keys, old.values)
                    new.keys[:, :, : self.cached].copy_(old.keys[:, :, : self.cached])
                    new.values[:, :, : self.cached].copy_(old.values[:, :, : self.cached])
                    new.cumulative_length.fill_(self.cached)
        self.cache, self.capacity = cache, capacity

    def rollback(self, length: int) -> None:
        """Forget the cached positions ``length`` and after (no-op when they are not cached)."""
        if self.use_cache and self.cached > length:
            if self.capacity:  # static: move the write position back; stale entries are masked, then overwritten
                for layer in self.cache.layers:
                    if layer.is_initialized:
                        layer.cumulative_length.fill_(length)
            else:
                prune_cache(self.cache, self.cached - length)
            self.cached = length

    # ---- draft trees: one pass over many branches, then keep the accepted one ------------------
    def tree_pass(self, ids: Tensor, cur: int, nodes: List[int], parents: List[int]) -> Tensor:
        """Score a draft tree in one forward pass; returns logits ``[1 + N, V]``.

        ``ids[:, :cur]`` is the accepted sequence; every uncached position of it and the ``N`` nodes
        are fed together. Row 0 is the distribution after ``ids[0, cur - 1]`` (the root), row
        ``1 + i`` the one after node ``i``. Node ``i`` sits at position ``cur + depth(i)`` and attends
        to the accepted prefix, its ancestors and itself (a 4D additive mask, which transformers
        passes through as it is, with explicit ``position_ids``). Node ``i``'s keys and values are
        cached at slot ``cur + i`` until ``keep_branch``.
        """
        if not getattr(self, "_trees_checked", False):  # once per runner: it reads the forward's signature
            reason = tree_unsupported(self.model)
            if reason is not None:
                raise ValueError(reason)
            self._trees_checked = True
        depth = tree_depths(parents)
        n = len(nodes)
        if self.use_cache and self.cached >= cur:  # the root's logits need the last accepted token fed
            self.rollback(cur - 1)
        start = self.cached if self.use_cache else 0
        if self.use_cache and self.cache_kind == "static":
            self._reserve(cur + n)
        if self.use_cache and self.cache is None:
            self.cache = _rollback_capable_cache(self.model)
        node_ids = torch.tensor(nodes, dtype=torch.long, device=self.device)
        new = torch.cat([ids[0, start:cur].to(self.device), node_ids]).unsqueeze(0)
        positions = torch.cat([torch.arange(start, cur), cur + torch.tensor(depth, dtype=torch.long)]).to(self.device)
        kv_length = self.capacity if self.use_cache and self.capacity else cur + n
        mask = _tree_mask(start, cur, parents, kv_length, _compute_dtype(self.model), self.device)
        kwargs = {"input_ids": new, "position_ids": positions.unsqueeze(0), "attention_mask": mask,
                  "past_key_values": self.cache, "use_cache": self.use_cache}
        if self._logits_to_keep:
            kwargs["logits_to_keep"] = n + 1
        out = self._forward(kwargs)
        if self.use_cache:
            self.cache = out.past_key_values
            self.cached = cur + n
        return out.logits[0, -(n + 1) :]

    def keep_branch(self, cur: int, path: List[int]) -> None:
        """After a tree pass at ``cur``: keep positions ``< cur`` and the nodes of ``path`` (node
        indices, root to leaf), moved to positions ``cur, cur + 1, ...``; the cache then holds
        ``cur + len(path)`` positions. Static cache: the branch's rows are gathered into place and
        the write position moved; dynamic cache: gathered into place, then cropped."""
        if not self.use_cache or self.cache is None:
            return
        gather_branch(self.cache, cur, path)
        self.rollback(cur + len(path))

    def _forward(self, kwargs: dict):
        out = self.model(**kwargs)
        self.forward_passes += 1
        return out


def gather_branch(cache, cur: int, path: List[int]) -> None:
    """Move the keys and values of the tree nodes ``path`` (slots ``cur + i``) to slots ``cur, cur + 1, ...``."""
    if not path or list(path) == list(range(len(path))):  # the first nodes already sit in place
        return
    keep = cur + len(path)
    source = torch.tensor([cur + i for i in path], dtype=torch.long, device=cache.layers[0].keys.device)
    for layer in cache.layers:
        if layer.is_initialized:
            layer.keys[:, :, cur:keep] = layer.keys.index_select(2, source)
            layer.values[:, :, cur:keep] = layer.values.index_select(2, source)


def tree_depths(parents: List[int]) -> List[int]:
    """Depth of every node (0 for children of the root); refuses parents out of topological order."""
    depth: List[int] = []
    for i, parent in enumerate(parents):
        if not -1 <= parent < i:
            raise ValueError(f"node {i} has parent {parent}: parents must be -1 or an earlier node")
        depth.append(0 if parent < 0 else depth[parent] + 1)
    return depth


def _tree_mask(start: int, cur: int, parents: List[int], kv_length: int, dtype: torch.dtype, device) -> Tensor:
    """Additive mask ``[1, 1, cur - start + N, kv_length]``: 0 where a query attends, the dtype's
    minimum elsewhere. Prefix rows are causal; node ``i`` (slot ``cur + i``) sees slots ``< cur``,
    its ancestors and itself."""
    n = len(parents)
    sees = torch.zeros((cur - start + n, kv_length), dtype=torch.bool)
    prefix = torch.arange(start, cur)
    sees[: cur - start] = torch.arange(kv_length) <= prefix.unsqueeze(1)
    sees[cur - start :, :cur] = True
    node_rows = sees[cur - start :, cur : cur + n]
    for i, parent in enumerate(parents):
        if parent >= 0:
            node_rows[i] = node_rows[parent]
        node_rows[i, i] = True
    mask = torch.zeros(sees.shape, dtype=dtype).masked_fill_(~sees, torch.finfo(dtype).min)
    return mask[None, None].to(device)


def _compute_dtype(model: Module) -> torch.dtype:
    dtype = getattr(model, "dtype", torch.float32)
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else torch.float32


def tree_unsupported(model: Module) -> str | None:
    """Why ``model`` cannot verify draft trees (one line), or None when it can: a tree pass needs a
    decoder-only model with ``position_ids`` and full attention in every layer (a sliding window
    would have to be drawn into the tree mask, and a dynamic sliding layer keeps only its window)."""
    name = type(model).__name__
    if getattr(model.config, "is_encoder_decoder", False):
        return f"draft trees need a decoder-only model; {name} is encoder-decoder"
    if "position_ids" not in inspect.signature(model.forward).parameters:
        return f"draft trees need per-node positions; {name}'s forward takes no position_ids"
    config = model.config.get_text_config(decoder=True)
    layer_types = getattr(config, "layer_types", None)
    sliding = any(t != "full_attention" for t in layer_types) if layer_types else getattr(config, "sliding_window", None) is not None
    if sliding:
        return f"draft trees need full attention in every layer; {name} has sliding-window (or other) layers"
    return None
