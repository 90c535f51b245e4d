"""The C step: a whole pass of a Llama-family model (or its kin's, as ``models.layer_spec`` describes them) in one C call (``c_step.c``), float32 on CPU,
over the model's weights blocked once for the skinny kernel (``kernels.blocked``: q/k/v fused into
one matrix, gate/up into another; the layers' own skinny route reads views of the same copies).
A bfloat16 model's weights are blocked in bfloat16 and read by ``skinny_bf16.c`` on the path this
model takes (measured here once per gate/up shape, ``kernels.bf16.chosen``: a pair's two models each their own; named
by ``label``); the rest of its pass and its logits are float32, its KV cache bfloat16 (keys and values rounded once where
written, read widened); its decoder layers are released as a float32 model's are (``kernels.one_copy``).

``CStep(model)`` holds the weights' addresses; ``step(h, (cos, sin), cache, start, seen, n_last,
hidden_layers, head)`` runs one pass, on the model's weights as they are then: a step whose model changed
since (cast, loaded, restored, edited in place: ``read``) is made again first. ``step_unsupported(model)`` says why a model cannot run it. A
position's result depends only on its own row and the cache, never on the pass's width or the
thread count (``c_step.c``), so every pass width gives the same logits for a position, bit for bit.
"""
import ctypes
import time
import weakref
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.nn import Module

import kernels.ahead as ahead
import kernels.bf16 as bf16
import kernels.skinny as skinny
import kernels.once as once
import kernels.step_scratch as step_scratch
from kernels.blocked import DTYPES, blocked, fusable, fused, lasting
from kernels.kept_keys import KeptKeys, kept, passed, point
from kernels.one_copy import group_blocks, groups, release, released
from kernels.memory_fits import can_prepack, copy_fits
from kernels.prepacking import SKINNY, PrepackedLinear, changes, plan
from kernels.prompt_gemm import DEFAULT_CHUNK, MANY_ROWS, ROWS_MULTIPLE, chunk_bounds, plan_of  # noqa: F401 (ROWS_MULTIPLE: theirs)
from kernels.step_structs import Layer as _Layer, Top, dims as _dims
from models.llama import layout
from models.layer_spec import ModelSpec, family_of, model_spec, norm_eps, norm_modules, spec_unsupported
from utils.logits_processor import with_tops
from utils.module_walk import first_parameter

# A pass over more positions (a long prompt) runs in chunks of this many (or its model's prompt plan's,
# ``kernels.prompt_gemm``), one C call each, each seeing the cache its chunks before wrote: the same
# result bit for bit (a row never depends on the others), with the scratch and the working set of a
# chunk bounded (its activations stay in the caches).
CHUNK_ROWS = DEFAULT_CHUNK  # cut by ``kernels.prompt_gemm.chunk_bounds``

STEP_ATTENTION = "the step's own, row by row"  # what the headers say of the step's attention (exact softmax in C)
_NO_LAYERS = torch.empty(0, dtype=torch.int64)  # a pass keeping no hidden states: read by no one (count 0), never written
LABEL = "C step (skinny linears on blocked weights, q/k/v and gate/up fused, row-invariant)"


def _norms(layer: Module, spec: ModelSpec) -> List[Optional[Module]]:
    """A layer's norm modules in ``_Layer``'s order: in_norm, post_norm (before the MLP), attn_out_norm,
    mlp_out_norm, q_norm, k_norm (None where it has none)."""
    attn_in, attn_out, mlp_in, mlp_out = norm_modules(layer, spec)
    qk = (layer.self_attn.q_norm, layer.self_attn.k_norm) if spec.family.qk_norm else (None, None)
    return [attn_in, mlp_in, attn_out, mlp_out, *qk]


def _norm_weight(norm: Optional[Module], spec: ModelSpec) -> Optional[Tensor]:
    """What the step multiplies a normed row by: the weight, or Gemma's ``1 + w`` (float32, as
    transformers computes it: the same numbers)."""
    if norm is None:
        return None
    weight = norm.weight.detach()
    return 1.0 + weight.float() if spec.family.norm == "1+w" else weight.float()  # float32 in the step, whatever the weights


class _Released:
    """What the checks read of a released layer (``kernels.one_copy``): its weight's shape and dtype
    (its blocks', float32 or bfloat16), on CPU (it was when blocked), without unblocking it."""

    def __init__(self, layer: Module):
        self.weight = torch.empty((), dtype=layer.blocks.dtype).expand(layer.out_features, layer.in_features)
        self.bias, self.out_features, self.in_features = layer.bias, layer.out_features, layer.in_features


def _own(linear: Module):
    """The ``nn.Linear`` behind a layer (its own, or the one a ``PrepackedLinear`` routes; a released
    one's shape, ``_Released``), else None."""
    own = getattr(linear, "linear", [linear])[0] if type(linear).__name__ == "PrepackedLinear" else linear
    if type(own) is not torch.nn.Linear or own._forward_hooks or own._forward_pre_hooks:
        return None
    return _Released(linear) if released(linear) else own


def step_unsupported(model: Module) -> Optional[str]:
    """Why ``model`` (a model the lean forward takes) cannot run the C step (the one feature), or None."""
    built, why = skinny.available()
    if not built:
        return why
    if family_of(model) is None or spec_unsupported(model) is not None:
        return spec_unsupported(model) if family_of(model) is not None else "its family is none the step computes"
    config, body, spec = model.config, model.model, model_spec(model)
    layers = body.layers[: config.num_hidden_layers]
    if len(spec.windows) > 1:
        return "its layers slide over windows of different sizes: the step takes one"
    if len({norm_eps(n) for layer in layers for n in _norms(layer, spec) if n is not None} | {norm_eps(body.norm)}) > 1:
        return "its norms' epsilons differ: the step takes one"
    head = model.get_output_embeddings()
    dtype = _own(head).weight.dtype if _own(head) is not None else torch.float32  # the layers' must match it
    for layer in layers:
        qkv, o, gate_up, down = groups(layer)
        owns = [_own(m) for m in qkv + o + gate_up + down]
        if any(x is None for x in owns):
            return "a linear layer is quantized, hooked or not nn.Linear"
        if any(x.weight.dtype not in DTYPES or x.weight.dtype != dtype or x.weight.device.type != "cpu" for x in owns):
            return "the step runs float32 or bfloat16 weights on CPU"
        if any(x.bias is not None for x in owns[len(qkv) + 1:]):
            return "its MLP has biases"
        if not fusable([x.weight for x in owns[: len(qkv)]]) or not fusable([x.weight for x in owns[len(qkv) + 1: -1]]):
            return "its q/k/v or gate/up sizes are not multiples of 16" + (", or an input size is odd" if dtype == torch.bfloat16 else "")
        if dtype == torch.bfloat16 and any(x.in_features % 2 for x in owns):
            return "an input size is odd (bfloat16 weights are read in pairs)"
        if layer.self_attn.head_dim > 512:
            return "head size over 512"
    if _own(head) is None or _own(head).weight.dtype != dtype:
        return f"its output layer is not a {str(dtype).removeprefix('torch.')} nn.Linear"
    each = dtype.itemsize
    groups_bytes = [sum(x.in_features * x.out_features * each for x in group) for layer in layers for group in groups(layer)]
    head_bytes = head.in_features * head.out_features * each
    # the bytes held twice at once: where the layers are released (``kernels.one_copy``, wherever oneDNN's
    # PrepackedLinear can hold them) a group at a time and the output layer (copied where not in place);
    # else every blocked copy beside the weights
    twice = max(groups_bytes) + head_bytes if can_prepack() else sum(groups_bytes) + head_bytes
    if not copy_fits(twice):
        return f"its blocked weights would hold {twice / 2**30:.1f} GiB twice at once, over a quarter of this machine's memory"
    return None


def step_for(model: Module, rows: int, unsupported: bool = True) -> bool:
    """Whether a pass of ``model`` over ``rows`` positions runs the C step: float32 or bfloat16 on CPU, where the
    model has no kernel plan (as loaded), or where its plan (``kernels.prepacking.plan``) runs that
    width on the skinny kernel (past the measured widths, where one-position passes do: a draft tree's
    pass, and a prompt of any length, run on what decoding runs, so every row is exact by
    construction), and (``unsupported``: checked here) ``step_unsupported`` finds nothing. A prompt
    needs no measurement of its own: the skinny kernel's register tiles (12 rows x 32 features on
    AVX-512) run near the core's arithmetic peak on many rows too, ahead of MKL (docs/profile.md)."""
    weight = first_parameter(model)  # next(model.parameters(), None), read at every pass
    if weight is None or weight.dtype not in DTYPES or weight.device.type != "cpu":
        return False
    route = plan(model)
    if route is not None and route[rows - 1 if rows < len(route) else 0] != SKINNY:
        return False
    return not unsupported or step_unsupported(model) is None


def _blocks(group: Sequence[Module]) -> Tensor:
    """The blocked copy the step reads for a group of linears: the released one, else made (fused) now,
    or checked against the weights' values (``kernels.blocked``'s ``verify``: an edit through ``.data``)."""
    found = group_blocks(group)
    if found is not None:
        return found
    if any(released(x) for x in group):  # never made so (release and restore go a whole model at once)
        raise ValueError("a fused group of linears is partly released: its weights are in no one copy")
    weights = [_own(x).weight for x in group]
    return fused(weights, verify=skinny.holds) if len(weights) > 1 else blocked(weights[0], verify=skinny.holds)


class StepRefused(RuntimeError):
    """The model changed, since its step was made, into one the step cannot run (``step_unsupported``'s reason):
    the runner that held it runs transformers' forward from then on (``runners.lean``)."""


def _of(tensor: Optional[Tensor]) -> Optional[Tuple[int, int]]:
    return None if tensor is None else (tensor.data_ptr(), tensor._version)


def read(model: Module) -> tuple:
    """What the C step reads of ``model``, by identity: each tensor's address and version, a released
    layer's blocks by address, each norm's epsilon. While it is unchanged, the step's copies and addresses
    hold the model's weights; a cast, a load, a ``restore`` or an in-place edit changes it. (An edit through
    ``.data`` changes no version: ``CStep`` compares the copies it did not make itself with their weights when
    it is made, at a runner's first pass on it.) About 30 us a layer (a runner's first pass, never per pass)."""
    config, body, spec = model.config, model.model, model_spec(model)
    found: list = [config.num_hidden_layers]
    for layer in list(body.layers)[: config.num_hidden_layers]:  # a ModuleList's slice is a new ModuleList: 0.3 ms
        found += [None if n is None else (_of(n.weight), norm_eps(n)) for n in _norms(layer, spec)]
        for group in groups(layer):
            for x in group:
                own = x.linear[0] if type(x).__name__ == "PrepackedLinear" else x
                found += [x.blocks.data_ptr() if released(x) else _of(own.weight), _of(own.bias)]
    head, final = model.get_output_embeddings(), (_of(body.norm.weight), norm_eps(body.norm))
    if released(head):
        return tuple(found + [final, head.blocks.data_ptr()])
    head = head.linear[0] if type(head).__name__ == "PrepackedLinear" else head
    return tuple(found + [final, _of(head.weight)])


def gate_up_shape(model: Module) -> Tuple[int, int]:
    """(N, K) of the first decoder layer's gate/up as the step reads it (fused): the linear a bfloat16 path is measured on."""
    gate_up = groups(model.model.layers[0])[2]
    owns = [_own(x) for x in gate_up]
    return sum(x.out_features for x in owns), owns[0].in_features


def weights_format(model: Module, library: ctypes.CDLL) -> int:
    """``c_step.c``'s ``Dims.weights`` for ``model``: float32 (``kernels.bf16.F32``), or the bfloat16 path this model
    takes (``kernels.bf16.chosen``: measured on the model's gate/up the first time its shape is asked); and how far
    ahead the tiles of its dtype prefetch (``kernels.ahead.settle``: measured the first time its dtype is asked)."""
    dtype = _own(model.get_output_embeddings()).weight.dtype  # a released one's blocks': no weight unblocked
    mine = [group_blocks(groups(layer)[2]) for layer in model.model.layers[: model.config.num_hidden_layers]]
    mine = mine if all(b is not None for b in mine) else None  # released: timed on them, no copy made
    fmt = bf16.chosen(library, gate_up_shape(model), mine) if dtype == torch.bfloat16 else bf16.F32
    ahead.settle(library, fmt, gate_up_shape(model), mine)
    return fmt


def short_label(model: Module) -> str:
    """The C step in a few words: "C step", or with a bfloat16 model's path and why it runs: "C step,
    AVX-512 widening load by measurement", "C step, avx512_bf16 dot, forced"."""
    if next(model.parameters()).dtype != torch.bfloat16 or not skinny.available()[0]:
        return "C step"
    library = skinny.library()
    return f"C step, {bf16.short_words(library, weights_format(model, library), gate_up_shape(model))}"


def label(model: Module) -> str:
    """The headers' name of the C step running ``model``: ``LABEL``, with a bfloat16 model's path, why and its many-row
    variant, and how far ahead decoding prefetches (``kernels.ahead``: "...; weights prefetched 4 KB ahead by measurement)")."""
    if not skinny.available()[0]:
        return LABEL
    library = skinny.library()
    if next(model.parameters()).dtype != torch.bfloat16:
        return f"{LABEL[:-1]}; {ahead.words(library, bf16.F32)})"
    fmt = weights_format(model, library)
    return f"C step ({bf16.describe(library, fmt, gate_up_shape(model))}; {LABEL.split(' (', 1)[1][:-1]}; {ahead.words(library, fmt)})"


class CStep:
    """The model's weights as the C step reads them; bound to a cache by ``bind``. Shapes: ``r``
    positions a pass feeds, ``H`` hidden size, ``D`` head size, ``V`` vocabulary. Making it releases
    the decoder layers' own weights (``kernels.one_copy``): the blocked copies are their one copy."""

    def __init__(self, model: Module):
        self.model = weakref.ref(model)  # weakly: a runner holds its model, the step never keeps one alive
        self._build(model)

    def current(self) -> None:
        """Made again where the model changed since (``read``): a cast back to float32, a loaded state
        dict, layers restored, a weight edited in place, a module or parameter replaced. A step a runner holds
        never runs stale copies. Per pass, where the step reads released layers, only what can change them is
        compared (the casts, loads and restores of prepacked layers and any module, parameter or buffer
        replaced, ``changes``, and the output layer's weight: its copy is the step's own), about a microsecond;
        the whole model (``read``) when one did. Raises ``StepRefused`` where the model changed into one the
        step cannot run."""
        model = self.model()
        glance = None if model is None else self.glance()
        if model is None or glance == self.glanced and self.released:
            return
        if glance != self.glanced and (why := step_unsupported(model)) is not None:  # e.g. a layer replaced by a LoRA wrapper
            raise StepRefused(why)
        if read(model) != self.read:
            self._build(model)
        self.glanced = self.glance()

    def glance(self) -> tuple:
        """What ``current`` compares per pass: the count of ``changes``, and the tensors the step copied
        (the output layer's weight, q/k/v biases where the model has them) by address and version."""
        return changes(), *(_of(t) for t in (self.output.weight, *self.copied))

    @lasting()  # its tensors outlive an inference_mode block it is made in (``kernels.blocked.lasting``)
    def _build(self, model: Module) -> None:
        started = time.perf_counter()
        reason = step_unsupported(model)
        if reason is not None:
            raise ValueError(reason)
        self.library = skinny.library()
        release(model)  # float32 or bfloat16: the blocked copies are the layers' one copy (``kernels.one_copy``)
        config, body, spec = model.config, model.model, model_spec(model)
        self.spec = spec
        self.layers = list(body.layers[: config.num_hidden_layers])
        self.dims = _dims(model, spec)
        self.dims.weights = weights_format(model, self.library)
        self.shape = gate_up_shape(model)  # the key of its bfloat16 path's choices (``kernels.bf16.chosen``)
        for layer in model.modules():  # its layers' own route (a peer's row, transformers' generate) takes the same path
            if type(layer) is PrepackedLinear:
                layer.path_shape = self.shape
        self.keep: List[Tensor] = []  # every tensor whose address the structs hold
        self.copied: List[Tensor] = []  # the model's tensors the step holds copies of (``glance``)
        self.structs = (_Layer * len(self.layers))()
        for struct, layer, at in zip(self.structs, self.layers, spec.layers):
            qkv, (o,), gate_up, (down,) = groups(layer)
            owns = [_own(x) for x in qkv]
            biases = [x.bias for x in owns]
            self.copied += [b for b in biases if b is not None]
            qkv_bias = None
            if any(b is not None for b in biases):
                qkv_bias = torch.cat([(b.detach().float() if b is not None else torch.zeros(x.out_features)) for b, x in zip(biases, owns)])
            norms = _norms(layer, spec)
            if spec.family.norm == "1+w":  # the step's copies: an in-place edit of the weights must remake them
                self.copied += [n.weight for n in norms if n is not None]
            names = ("in_norm", "post_norm", "attn_out_norm", "mlp_out_norm", "q_norm", "k_norm")
            parts = dict(zip(names, (_norm_weight(n, spec) for n in norms)), qkv=_blocks(qkv), qkv_bias=qkv_bias, o=_blocks([o]),
                         o_bias=None if _own(o).bias is None else _own(o).bias.detach(), gate_up=_blocks(gate_up),
                         down=_blocks([down]))
            for name, tensor in parts.items():
                setattr(struct, name, self._address(tensor))
            struct.window, struct.rope = at.window or 0, -1 if at.rope is None else at.rope
        self.final_norm = _norm_weight(body.norm, spec).contiguous()
        if spec.family.norm == "1+w":
            self.copied.append(body.norm.weight)
        head = model.get_output_embeddings()
        self.output = _own(head)
        # released with the layers (``kernels.one_head``): its blocks are its one copy; else one made beside it
        self.head = head.blocks if released(head) else blocked(self.output.weight, verify=skinny.holds)
        self.vocab = model.get_output_embeddings().out_features
        self.cache_keys: Tuple[int, ...] = ()  # the bound cache's tensors' addresses, at ``layout()`` count ``bound[1]``
        self.bound, self.blocks_at = None, None  # (its cache, weakly; that count); the kept key blocks the structs point at
        self.scratch = torch.empty(0)  # grown to the largest pass yet: no allocation per pass
        # the model's tensors it read, held: a replaced one's address is never reused while ``read`` holds it
        self.sources = [p for p in model.parameters()]
        self.read = read(model)
        # every decoder linear released: their copies change only by a restore (``changes``), not by an edit
        self.released = all(released(x) for layer in self.layers for group in groups(layer) for x in group)
        self.glanced = self.glance()
        once.note("C step", f"made for a {len(self.layers)}-layer model, gate/up {self.shape[0]}x{self.shape[1]}", started)

    def _address(self, tensor: Optional[Tensor]) -> Optional[int]:
        if tensor is None:
            return None
        tensor = tensor.contiguous()
        self.keep.append(tensor)
        return tensor.data_ptr()

    def linears(self, layer: int) -> Tuple[Tuple[int, int, int], ...]:
        """Decoder layer ``layer``'s blocked matrices as the step reads them, each ``(address, N, K)``: q/k/v
        fused, o, gate/up fused, down (``kernels.blocked`` layout; float32 or bfloat16 as ``dims.weights``)."""
        d, s = self.dims, self.structs[layer]
        return ((s.qkv, (d.Hq + 2 * d.Hkv) * d.D, d.H), (s.o, d.H, d.Hq * d.D), (s.gate_up, 2 * d.I, d.H), (s.down, d.H, d.I))

    def bind(self, cache) -> Optional[KeptKeys]:
        """Point the step at ``cache`` (``models.llama.KVCache``, float32 or bfloat16 ``[1, Hkv, cap, D]`` a layer) and at its
        kept key blocks (``kernels.kept_keys``); returns them (None: none kept). Its tensors walked only where it is
        another cache than the last pass's or ``layout()`` moved (keys and values: a step shared by runners,
        ``kernels.step_pool``, may meet a cache whose keys sit where a freed cache's did, its values elsewhere)."""
        if self.bound is None or self.bound[0]() is not cache or self.bound[1] != layout():
            keys = tuple([t.data_ptr() for layer in cache.layers for t in (layer.keys, layer.values)])
            if keys != self.cache_keys or self.dims.cap != cache.capacity:
                for struct, layer in zip(self.structs, cache.layers):
                    struct.keys, struct.values = layer.keys.data_ptr(), layer.values.data_ptr()
                self.dims.cap, self.cache_keys = cache.capacity, keys
            self.bound, self.dims.kv = (weakref.ref(cache), layout()), {torch.float32: 0, torch.bfloat16: 1}[cache.layers[0].keys.dtype]  # Dims.kv
        state = kept(cache, self.dims.Hkv, self.dims.D, self.cache_keys)
        self.blocks_at = point(self.structs, state, self.blocks_at)
        return state

    def __call__(self, h: Tensor, rope: Tuple[Tensor, Tensor], cache, start: int, seen: Optional[Tensor], n_last: int,
                 hidden_layers: Sequence[int] = (), head=None) -> Tuple[Tensor, Optional[Tensor]]:
        """One pass: ``h`` ``[r, H]`` the fed ids' embeddings (overwritten), ``rope``: cos, sin ``[T, r, R]`` (the
        model's RoPE tables, ``ModelSpec.ropes``), their keys and values written to slots ``start..start + r - 1``
        of ``cache``; ``seen`` bool, a tree pass's ``[r, start + r]``, or ``[2, r, start + r]``: what the full
        layers see, then what the sliding ones do (``models.llama.window_seen``); None: causal. Returns logits ``[n_last, V]``, each
        row's greedy token read in the same call kept on them (``utils.logits_processor.with_tops``; ``head``:
        ``[n_last, head.rows]``, a drafter's rows, ``kernels.head_rows``, none kept) and, with ``hidden_layers``, the residual stream entering those layers ``[r, len(hidden_layers) * H]``."""
        self.current()
        state = self.bind(cache)
        r, threads = h.shape[0], torch.get_num_threads()
        h = h.to(torch.float32).contiguous()  # written in place: the caller's embeddings, made for this pass
        cos, sin = (t.to(torch.float32).contiguous() for t in rope)
        prompt = plan_of(self.model())  # a long pass's variant and chunks: speed only, the same bits
        chunk = prompt.chunk or CHUNK_ROWS
        # a long chunk's variant: the float32 plan's, or the bfloat16 path's many-row one (speed only, the same bits)
        tile = prompt.tile if self.dims.weights == bf16.F32 else bf16.prompt_tile(self.library, self.dims.weights, MANY_ROWS + 1, self.shape)
        needed = self.library.c_step_scratch(ctypes.byref(self.dims), ctypes.c_int64(min(r, chunk)), ctypes.c_int64(threads))
        if self.scratch.numel() < needed:
            step_scratch.grow(self, needed, f"a pass of {r} positions")
        output = self.head if head is None else head.blocks  # a part: the first blocks of its copy (one slice, read alike)
        logits = torch.empty((n_last, self.vocab if head is None else head.rows))
        at = torch.tensor(list(hidden_layers), dtype=torch.int64) if hidden_layers else _NO_LAYERS
        hidden = torch.empty((r, len(hidden_layers) * self.dims.H)) if hidden_layers else None
        mask = None if seen is None else seen.to(torch.uint8).view(-1, r, start + r)
        first_logit = r - n_last  # the first position whose logits are asked
        tops = (Top * n_last)() if head is None else None  # each row's argmax, read in the same call (``with_tops``)
        for a, b in chunk_bounds(r, chunk):
            self.dims.tile = tile if b - a > bf16.decoding_rows(self.library, self.dims.weights) else 0  # decoding's loop up to it
            masks = (None, None) if mask is None else tuple(m[a:b, : start + b].contiguous() for m in mask[[0, -1]])
            asked = max(0, b - max(a, first_logit))  # this chunk's last `asked` positions have logits asked
            out = logits[max(a, first_logit) - first_logit:][:asked]  # [asked, V]: V the columns, asked the rows
            self.dims.kept = 0 if state is None else state.upto  # the blocks it transposes: from min(kept, start + a)
            self.dims.tops = None if tops is None or not asked else ctypes.addressof(tops) + (max(a, first_logit) - first_logit) * ctypes.sizeof(Top)
            self._run((h[a:b], cos[:, a:b].contiguous(), sin[:, a:b].contiguous()), start + a, masks, at,
                      None if hidden is None else hidden[a:b], out, output, threads)
            passed(cache, state, start + b)
        self.dims.tops = None
        return (logits if tops is None else with_tops(logits, [(t.at, t.top, t.others) for t in tops])), hidden

    def _run(self, rows: Tuple[Tensor, Tensor, Tensor], start: int, masks: Tuple[Optional[Tensor], Optional[Tensor]], at: Tensor,
             hidden: Optional[Tensor], logits: Tensor, head: Tensor, threads: int) -> None:
        """One C call over the contiguous ``rows`` (embeddings, cos, sin) from slot ``start`` (``__call__``'s arguments,
        sliced; ``masks``: what the full and the sliding layers see, or None); ``logits`` ``[n, V]``: ``head``'s first V rows'."""
        h, cos, sin = rows
        c = ctypes.c_void_p
        mask, window = (None if m is None else m.data_ptr() for m in masks)
        self.library.c_step(
            ctypes.byref(self.structs), ctypes.byref(self.dims), c(h.data_ptr()), c(cos.data_ptr()), c(sin.data_ptr()),
            ctypes.c_int64(h.shape[0]), ctypes.c_int64(start), c(mask), c(window), c(at.data_ptr()),
            ctypes.c_int64(at.numel()), c(None if hidden is None else hidden.data_ptr()), c(self.final_norm.data_ptr()),
            c(head.data_ptr()), ctypes.c_int64(logits.shape[1]), c(logits.data_ptr()), ctypes.c_int64(logits.shape[0]),
            c(self.scratch.data_ptr()), ctypes.c_int64(threads))
