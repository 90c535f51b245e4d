"""Draft trees in one forward pass: node depths, the tree attention mask, the pass's inputs, and
the gather that keeps the accepted branch, and ``TreePasses``: ``tree_pass``/``keep_branch`` written once
for every runner."""
import inspect
from typing import List

import torch
from torch import Tensor
from torch.nn import Module

from kernels.kept_keys import moving


def tree_depths(parents: List[int]) -> List[int]:
    """Depth of every node (0 for children of the root); refuses parents out of topological order."""
    depth: List[int] = []
    for i, parent in enumerate(parents):
        if not -1 <= parent < i:
            raise ValueError(f"node {i} has parent {parent}: parents must be -1 or an earlier node")
        depth.append(0 if parent < 0 else depth[parent] + 1)
    return depth


def tree_mask(start: int, cur: int, parents: List[int], kv_length: int, dtype: torch.dtype, device) -> Tensor:
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


def compute_dtype(model: Module) -> torch.dtype:
    """The floating-point dtype of ``model``'s activations (float32 when it names none)."""
    dtype = getattr(model, "dtype", torch.float32)
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else torch.float32


def tree_inputs(runner, ids: Tensor, start: int, cur: int, nodes: List[int], parents: List[int], depth: List[int],
                kv_length: int) -> dict:
    """The forward's keywords of a tree pass of ``runner`` (its ``model`` and ``device``): ``input_ids``
    ``[1, cur - start + N]`` (the uncached accepted positions ``ids[0, start:cur]``, then the ``N``
    nodes), ``position_ids`` (node ``i`` at
    ``cur + depth(i)``) and the ``attention_mask`` over ``kv_length`` key slots (node ``i`` at slot
    ``cur + i``: the cache's capacity for a static cache, ``cur + N`` otherwise). ``depth`` is
    ``tree_depths(parents)``, computed by the caller before it touches its cache."""
    device = runner.device
    node_ids = torch.tensor(nodes, dtype=torch.long, device=device)
    new = torch.cat([ids[0, start:cur].to(device), node_ids]).unsqueeze(0)
    positions = torch.cat([torch.arange(start, cur), cur + torch.tensor(depth, dtype=torch.long)]).to(device)
    mask = tree_mask(start, cur, parents, kv_length, compute_dtype(runner.model), device)
    return {"input_ids": new, "position_ids": positions.unsqueeze(0), "attention_mask": mask}


def gather_branch(cache, cur: int, path: List[int]) -> None:
    """Move the keys and values of the tree nodes ``path`` (slots ``cur + i``) to slots ``cur, cur + 1, ...``
    (static or dynamic cache: any cache with ``layers`` of ``keys``/``values`` ``[1, heads, slots, head_dim]``)."""
    if not path or list(path) == list(range(len(path))):  # the first nodes already sit in place
        return
    keep = cur + len(path)
    source = torch.tensor([cur + i for i in path], dtype=torch.long, device=cache.layers[0].keys.device)
    with moving(cache, cur):  # the C step's kept key blocks before ``cur`` stay current (``kernels.kept_keys``)
        for layer in cache.layers:
            if layer.is_initialized:
                layer.keys[:, :, cur:keep] = layer.keys.index_select(2, source)
                layer.values[:, :, cur:keep] = layer.values.index_select(2, source)


def tree_unsupported(model: Module) -> str | None:
    """Why ``model`` cannot verify draft trees (one line), or None when it can: a tree pass needs a
    decoder-only model with ``position_ids`` and full attention in every layer (a sliding window
    would have to be drawn into the tree mask, and a dynamic sliding layer keeps only its window)."""
    own = getattr(model, "tree_unsupported", None)
    if callable(own):  # a model that is no transformers module says it itself (runners.llama_model.GGUFModel)
        return own()
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


class TreePasses:
    """``Runner.tree_pass`` and ``Runner.keep_branch``, written once for every runner: the rule (the
    root's logits need the last accepted token fed, so a cache holding ``cur`` drops back to
    ``cur - 1``; the pass feeds the uncached prefix and the nodes; the cache then holds ``cur + N``
    slots, and ``cur + len(path)`` once the branch is kept). The runner has ``model``, ``device``,
    ``cache``, ``cached``, ``use_cache``, ``forward_passes`` and ``rollback``, and supplies what differs:

    * ``_tree_room(length) -> kv_length``: a cache that holds ``length`` positions (reserved or made),
      and the key slots the tree mask spans (a static cache's capacity, else ``length``);
    * ``_tree_forward(kwargs, start, n) -> Tensor``: one forward pass with the tree's ``kwargs``
      (``tree_inputs``) into its cache, feeding positions ``start..``; logits ``[1 + n, V]`` of the
      root and the ``n`` nodes; it counts the pass and keeps the cache the model returns;

    or, a runner whose passes are no torch forward (``runners.llama_cpp``), the hooks these two serve:
    ``_tree_refusal``, ``_tree_prepare``, ``_tree_run`` and ``_keep_tree_branch``.
    """

    _trees_checked = False  # per runner, once: tree_unsupported reads the forward's signature

    def tree_pass(self, ids: Tensor, cur: int, nodes: List[int], parents: List[int]) -> Tensor:
        """Score a draft tree in one forward pass; returns logits ``[1 + N, V]``.

        ``ids[:, :cur]`` is the accepted sequence; every uncached position of it and the ``N`` nodes
        are fed together. Row 0 is the distribution after ``ids[0, cur - 1]`` (the root), row
        ``1 + i`` the one after node ``i``. Node ``i`` sits at position ``cur + depth(i)`` and attends
        to the accepted prefix, its ancestors and itself (a 4D additive mask, which transformers
        passes through as it is, with explicit ``position_ids``). Node ``i``'s keys and values are
        cached at slot ``cur + i`` until ``keep_branch``. A compiled runner runs this pass eagerly
        (a tree's mask is an input its graphs do not take) into its static cache.
        """
        reason = self._tree_refusal()
        if reason is not None:
            raise ValueError(reason)
        depth = tree_depths(parents)
        self._tree_prepare(parents)
        if self.use_cache and self.cached >= cur:  # the root's logits need the last accepted token fed
            self.rollback(cur - 1)
        start = self.cached if self.use_cache else 0
        logits = self._tree_run(ids, start, cur, nodes, parents, depth)
        if self.use_cache:
            self.cached = cur + len(nodes)
        return logits

    def keep_branch(self, cur: int, path: List[int]) -> None:
        """After a tree pass at ``cur``: keep positions ``< cur`` and the nodes of ``path`` (node
        indices, root to leaf), moved to positions ``cur, cur + 1, ...``; the cache then holds
        ``cur + len(path)`` positions. Static cache: the branch's rows are gathered into place and
        the write position moved; dynamic cache: gathered into place, then cropped."""
        if self._keep_tree_branch(cur, path):
            self.rollback(cur + len(path))

    # ---- the hooks: a torch runner's, through _tree_room and _tree_forward -----------------------
    def _tree_refusal(self) -> str | None:
        """Why this runner verifies no draft tree (None: it does); the model's ``tree_unsupported``, read once."""
        if self._trees_checked:
            return None
        reason = tree_unsupported(self.model)
        self._trees_checked = reason is None
        return reason

    def _tree_prepare(self, parents: List[int]) -> None:
        """Before the rule touches the cache: refuse a tree this runner cannot take, claim what it needs."""

    def _tree_run(self, ids: Tensor, start: int, cur: int, nodes: List[int], parents: List[int], depth: List[int]) -> Tensor:
        """The pass itself, feeding ``ids[0, start:cur]`` and the nodes; logits ``[1 + N, V]``."""
        kv_length = self._tree_room(cur + len(nodes))
        return self._tree_forward(tree_inputs(self, ids, start, cur, nodes, parents, depth, kv_length), start, len(nodes))

    def _keep_tree_branch(self, cur: int, path: List[int]) -> bool:
        """Move the branch's keys and values to positions ``cur..``; False where no cache holds them."""
        if not self.use_cache or self.cache is None:
            return False
        gather_branch(self.cache, cur, path)
        return True
