"""A GGUF file opened by llama.cpp (through llama-cpp-python's low-level API, ``llama_cpp.llama_cpp``):
its weights loaded once per process, what the loops read of a model (``GGUFModel.config``: the
vocabulary, the context window, the layers), and the one llama.cpp context a ``LlamaCppRunner``
decodes on. llama-cpp-python is optional: ``llama_cpp_missing`` says why it cannot be used."""
import ctypes
import importlib.util
from collections import deque
from pathlib import Path
from typing import Any, Deque, Dict, List, Optional

import numpy
import torch

# draft-tree leaves one pass may have: each leaf is a llama.cpp sequence id, 0 is the accepted sequence's
MAX_LEAVES = 64
_ERRORS: Deque[str] = deque(maxlen=8)  # llama.cpp's latest error lines (its log callback keeps nothing else)
_LOADED: Dict[str, "GGUFModel"] = {}
_STATE: Dict[str, Any] = {}  # the library, once: the module and the log callback (kept alive here)


def llama_cpp_missing() -> Optional[str]:
    """Why llama.cpp's runner cannot run here (one line), or None when llama-cpp-python is installed."""
    if importlib.util.find_spec("llama_cpp") is None:
        return "llama-cpp-python is not installed (make llama-cpp builds it; docs/llama-cpp.md)"
    return None


def library():
    """``llama_cpp.llama_cpp``, with its backend initialised and its log reduced to errors (kept for
    ``last_error``). Raises ``ImportError`` with one line when llama-cpp-python is missing."""
    if "lib" not in _STATE:
        missing = llama_cpp_missing()
        if missing is not None:
            raise ImportError(missing)
        import llama_cpp.llama_cpp as lib

        def log(level: int, text: bytes, _user: Any) -> None:
            if level == 4 and text:  # GGML_LOG_LEVEL_ERROR; the rest (loading, info) is dropped
                _ERRORS.append(text.decode("utf-8", "replace").strip())

        _STATE["log"] = lib.llama_log_callback(log)
        lib.llama_log_set(_STATE["log"], ctypes.c_void_p(0))
        lib.llama_backend_init()
        _STATE["lib"] = lib
    return _STATE["lib"]


def last_error() -> str:
    """llama.cpp's first error line since the last call ("" when none), then forgets them."""
    first = next((line for line in _ERRORS if line), "")
    _ERRORS.clear()
    return first


class GGUFModel:
    """A GGUF file's weights in llama.cpp, and what the decoding loops read of a model: ``config``
    (``vocab_size``, ``max_position_embeddings`` = the trained context, ``num_hidden_layers``,
    ``hidden_size``, ``sliding_window``), ``device`` (cpu), ``dtype`` (float32: the logits'). It has
    no torch weights: ``get_output_embeddings`` is None, and a runner passes llama.cpp ``ids``."""

    def __init__(self, path: Path):
        lib = library()
        params = lib.llama_model_default_params()
        params.n_gpu_layers = 0
        last_error()
        handle = lib.llama_model_load_from_file(str(path).encode(), params)
        if not handle:
            raise ValueError(f"llama.cpp cannot load {path.name}: {last_error() or 'not a GGUF model it knows'}")
        self.path, self.handle = path, handle
        self.vocab = lib.llama_model_get_vocab(handle)
        self.n_vocab = int(lib.llama_vocab_n_tokens(self.vocab))
        self.n_ctx = int(lib.llama_model_n_ctx_train(handle))
        buffer = ctypes.create_string_buffer(256)
        lib.llama_model_desc(handle, buffer, ctypes.c_size_t(256))
        self.description = buffer.value.decode("utf-8", "replace")  # "llama ?B Q4_1"
        self.recurrent = bool(lib.llama_model_is_recurrent(handle) or lib.llama_model_is_hybrid(handle))
        self.sliding = int(lib.llama_model_n_swa(handle))
        self.encoder = bool(lib.llama_model_has_encoder(handle))
        self.config = _config(self, int(lib.llama_model_n_layer(handle)), int(lib.llama_model_n_embd(handle)))
        self.device, self.dtype, self.name_or_path = torch.device("cpu"), torch.float32, str(path)
        self._context = None  # the one context runners share (``context``), made on first use

    @property
    def exact(self) -> bool:
        """Whether this llama.cpp build computes a position's logits alike in passes of any width: not
        where it has llamafile's sgemm (passes of 2+ positions on its kernels, of 1 on ggml's)."""
        return "LLAMAFILE = 1" not in library().llama_print_system_info().decode("utf-8", "replace")

    @property
    def weights(self) -> str:
        """The file's weight type as llama.cpp names it ("Q4_1"), the last word of its description."""
        return self.description.split()[-1] if self.description else "GGUF"

    def get_output_embeddings(self) -> None:
        """None: the output layer lives in llama.cpp (the loops read ``config.vocab_size``)."""
        return None

    def tree_unsupported(self) -> Optional[str]:
        """Why llama.cpp cannot verify draft trees of this model (one line), or None: trees are
        sequence ids over one KV cache, which recurrent state and a sliding window do not allow."""
        if self.recurrent:
            return f"draft trees need a KV cache that drops any position; {self.description} keeps recurrent state"
        if self.sliding:
            return f"draft trees need full attention in every layer; {self.description} has a sliding window"
        return None

    def tokenize(self, text: str, special: bool = True) -> List[int]:
        """``text`` in the file's own vocabulary (llama.cpp's tokenizer), special tokens such as
        ``<|im_start|>`` read as such when ``special``; no BOS added."""
        lib, data = library(), text.encode("utf-8")
        room = len(data) + 8
        tokens = (ctypes.c_int32 * room)()
        count = lib.llama_tokenize(self.vocab, data, len(data), tokens, room, False, special)
        if count < 0:
            raise ValueError(f"llama.cpp could not tokenize a text of {len(data)} bytes")
        return list(tokens[:count])

    def detokenize(self, ids: List[int]) -> str:
        """The text of ``ids`` (special tokens written out)."""
        lib, array = library(), (ctypes.c_int32 * max(1, len(ids)))(*ids)
        room = 16 * len(ids) + 16
        text = ctypes.create_string_buffer(room)
        count = lib.llama_detokenize(self.vocab, array, len(ids), text, room, False, True)
        return text.raw[: max(0, count)].decode("utf-8", "replace")

    def end_tokens(self) -> List[int]:
        """The ids that end a generation (llama.cpp's end-of-generation set: EOS, end of turn, ...)."""
        lib = library()
        return [t for t in range(self.n_vocab) if lib.llama_vocab_is_eog(self.vocab, t)]

    def context(self) -> "LlamaContext":
        """The context runners of this model decode on, made once (``n_ctx`` positions of KV cache)."""
        if self._context is None:
            self._context = LlamaContext(self)
        return self._context


class LlamaContext:
    """One llama.cpp context over ``model``: a unified KV cache of ``model.n_ctx`` positions for
    ``1 + MAX_LEAVES`` sequence ids, a batch of as many tokens (numpy views of its arrays), and the
    runner that owns it now (``owner``: a runner that finds another there starts again from nothing)."""

    def __init__(self, model: GGUFModel):
        lib = library()
        params = lib.llama_context_default_params()
        params.n_ctx = params.n_batch = model.n_ctx
        params.n_seq_max = 1 + MAX_LEAVES
        params.n_outputs_max_per_seq = 0
        params.kv_unified = True  # one cache for all sequence ids: a tree's nodes share the accepted prefix
        params.no_perf = True
        params.flash_attn_type = 0  # off: llama.cpp's CPU flash attention (its "auto") rounds differently by pass split
        params.n_threads = params.n_threads_batch = torch.get_num_threads()
        last_error()
        handle = lib.llama_init_from_model(model.handle, params)
        if not handle:
            raise RuntimeError(f"llama.cpp cannot make a context of {model.n_ctx} positions: {last_error() or 'out of memory?'}")
        self.handle, self.memory, self.capacity = handle, lib.llama_get_memory(handle), model.n_ctx
        self.batch = lib.llama_batch_init(model.n_ctx, 0, 1 + MAX_LEAVES)
        self.tokens = numpy.ctypeslib.as_array(self.batch.token, shape=(model.n_ctx,))
        self.positions = numpy.ctypeslib.as_array(self.batch.pos, shape=(model.n_ctx,))
        self.seq_counts = numpy.ctypeslib.as_array(self.batch.n_seq_id, shape=(model.n_ctx,))
        self.outputs = numpy.ctypeslib.as_array(self.batch.logits, shape=(model.n_ctx,))
        self.seq_counts[:] = 1
        for i in range(model.n_ctx):  # every token in sequence 0 unless a tree pass says otherwise
            self.batch.seq_id[i][0] = 0
        self.n_vocab, self.owner, self.threads = model.n_vocab, None, params.n_threads

    def claim(self, runner: object) -> bool:
        """Make ``runner`` the owner; True when it was not (the KV cache is then emptied)."""
        if self.owner is runner:
            return False
        library().llama_memory_clear(self.memory, False)
        self.owner = runner
        threads = torch.get_num_threads()
        if threads != self.threads:
            library().llama_set_n_threads(self.handle, threads, threads)
            self.threads = threads
        return True

    def decode(self, count: int, rows: int) -> torch.Tensor:
        """Run the batch's first ``count`` tokens (set by the caller); returns the logits ``[rows, V]``
        (float32, CPU) of the tokens marked as outputs, in batch order. RuntimeError in one line when
        llama.cpp refuses (no room in its KV cache, a token outside the vocabulary, ...)."""
        lib = library()
        self.batch.n_tokens = count
        last_error()
        code = lib.llama_decode(self.handle, self.batch)
        if code != 0:
            reason = {1: f"no room in its KV cache of {self.capacity} positions", 2: "aborted"}.get(code, "")
            raise RuntimeError(f"llama.cpp could not decode a pass of {count} positions (code {code}): {last_error() or reason}")
        logits = numpy.ctypeslib.as_array(lib.llama_get_logits(self.handle), shape=(rows, self.n_vocab))
        return torch.from_numpy(logits.copy())


def _config(model: GGUFModel, layers: int, hidden: int):
    """A transformers ``PretrainedConfig`` with what the loops read, from llama.cpp's reading of the file."""
    from transformers import PretrainedConfig

    return PretrainedConfig(vocab_size=model.n_vocab, max_position_embeddings=model.n_ctx, num_hidden_layers=layers,
                            hidden_size=hidden, sliding_window=model.sliding or None, is_encoder_decoder=model.encoder)


def gguf_model(path: str | Path) -> GGUFModel:
    """The GGUF file ``path`` loaded by llama.cpp, once per process (later calls return the same).
    ``ImportError``/``ValueError``/``FileNotFoundError`` in one line when it cannot be."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {path}")
    key = str(path.resolve())
    if key not in _LOADED:
        _LOADED[key] = GGUFModel(path)
    return _LOADED[key]
