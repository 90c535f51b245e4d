"""eagle.format: the EAGLE-3 head saved in the speculators format and loaded back (from it, or from the
original EAGLE-3 / SpecForge format), written atomically, refused with one line when it does not fit."""
import copy
import hashlib
import json
import multiprocessing
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save as safetensors_save, save_file

from conftest import llama
from eagle import format as fmt
from eagle.format import load_head, save_head
from eagle.head import Eagle3Head, HeadCache, HeadConfig

DRAFT_VOCAB = 64
WEIGHTS, CONFIG = "model.safetensors", "config.json"


@pytest.fixture(scope="module")
def target():
    return llama(layers=4)  # float64, vocab 96, hidden 32


def make_head(target, seed=0, own_embedding=False, **changes) -> Eagle3Head:
    """A float32 head for ``target``: random weights (norms included) and a random draft vocabulary."""
    config = HeadConfig.for_target(target, draft_vocab_size=DRAFT_VOCAB, **changes)
    head = Eagle3Head(config, embed_tokens=target.get_input_embeddings(), own_embedding=own_embedding)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    head.set_vocabulary(torch.randperm(config.target_vocab_size, generator=gen)[:DRAFT_VOCAB].sort().values)
    return head


def outputs(head: Eagle3Head) -> torch.Tensor:
    """Draft logits of five positions decoded from fixed features and tokens."""
    c, dtype = head.config, head.fc.weight.dtype
    gen = torch.Generator().manual_seed(1)
    features = torch.randn(1, 5, len(c.aux_layers) * c.target_hidden_size, generator=gen, dtype=torch.float64)
    ids = torch.randint(c.target_vocab_size, (1, 5), generator=gen)
    with torch.no_grad():
        hidden = head.fc(features.to(dtype))
        return head.logits(head.decode(HeadCache(head, 8, "cpu", dtype), head.embed(ids), hidden, 0))


def saved(tmp_path: Path, head: Eagle3Head, name: str = "head", **kwargs) -> Path:
    path = tmp_path / name
    save_head(head, path, **{"dtype": torch.float32, **kwargs})
    return path


def edit(folder: Path, tensors=None, config=None, seal: bool = True) -> None:
    """Change a saved head by hand; ``seal``: record the new weights' sha256 as a save would."""
    weights = load_file(folder / WEIGHTS)
    if tensors:
        tensors(weights)
    data = safetensors_save(weights, metadata={"format": "pt"})
    (folder / WEIGHTS).write_bytes(data)
    record = json.loads((folder / CONFIG).read_text())
    if config:
        config(record)
    if seal:
        record.setdefault("specdec", {})["sha256"] = hashlib.sha256(data).hexdigest()
    (folder / CONFIG).write_text(json.dumps(record))


def snapshot(folder: Path):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())} if folder.is_dir() else None


def assert_same_state(loaded: Eagle3Head, reference: dict) -> None:
    state = loaded.state_dict()
    assert sorted(state) == sorted(reference)
    for name, tensor in reference.items():
        assert state[name].dtype == (tensor.dtype if name in ("d2t", "t2d") else torch.float64), name
        assert torch.equal(state[name], tensor.to(state[name].dtype)), name


# ---- the speculators format ---------------------------------------------------------------------
@pytest.mark.parametrize("changes", [
    {},
    {"fc_bias": True, "norm_before_residual": True},
    {"rope_scaling": {"rope_type": "linear", "factor": 2.0}, "rope_theta": 5e5, "aux_layers": (0, 1, 3)},
], ids=["plain", "fc-bias-norm-before-residual", "rope-scaling-aux-layers"])
def test_float32_round_trip_gives_back_every_tensor_and_the_config_exactly(tmp_path, target, changes):
    head = make_head(target, **changes)
    loaded = load_head(saved(tmp_path, head) / CONFIG, target)  # a config.json path names its folder
    assert loaded.config == head.config and loaded.config.rope_scaling == head.config.rope_scaling
    assert_same_state(loaded, head.state_dict())
    assert loaded._target_embed[0] is target.get_input_embeddings() and not hasattr(loaded, "embed_tokens")
    torch.testing.assert_close(outputs(loaded), outputs(copy.deepcopy(head).double()), rtol=0, atol=0)


def test_bfloat16_save_rounds_each_weight_to_bfloat16_once_and_keeps_the_vocabulary_exact(tmp_path, target):
    head = make_head(target)
    path = saved(tmp_path, head, dtype=torch.bfloat16)
    stored = load_file(path / WEIGHTS)
    assert stored["d2t"].dtype == torch.int64 and stored["t2d"].dtype == torch.bool
    assert {t.dtype for k, t in stored.items() if k not in ("d2t", "t2d")} == {torch.bfloat16}
    loaded = load_head(path, target)
    rounded = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in head.state_dict().items()}
    assert_same_state(loaded, rounded)
    for name, tensor in head.state_dict().items():
        if tensor.is_floating_point():  # within bfloat16's rounding of the original
            torch.testing.assert_close(loaded.state_dict()[name], tensor.double(), rtol=2 ** -8, atol=0)


def test_saved_folder_has_the_speculators_eagle3_layout(tmp_path, target):
    head = make_head(target, fc_bias=True)
    extra = {"command": "python -m eagle.train --steps 3", "data": "tiny prompts"}
    path = saved(tmp_path, head, target_name="tiny/llama", extra=extra,
                 verifier_architectures=["LlamaForCausalLM"])
    config = json.loads((path / CONFIG).read_text())
    c = head.config
    assert config["speculators_model_type"] == "eagle3" and config["architectures"] == ["Eagle3Speculator"]
    assert config["transformer_layer_config"] == {
        "model_type": "llama", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "intermediate_size": 64, "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta,
        "max_position_embeddings": 256, "vocab_size": 96, "num_hidden_layers": 1, "hidden_act": "silu",
    }
    assert config["draft_vocab_size"] == 64 and config["target_hidden_size"] == 32
    assert config["norm_before_residual"] is False
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 2, 1]
    assert config["speculators_config"] == {
        "algorithm": "eagle3",
        "proposal_methods": [
            {"proposal_type": "greedy", "speculative_tokens": 5, "verifier_accept_k": 1, "accept_tolerance": 0.0}],
        "default_proposal_method": "greedy",
        "verifier": {"name_or_path": "tiny/llama", "architectures": ["LlamaForCausalLM"]},
    }
    assert config["speculators_version"] and config["torch_dtype"] == "float32"
    assert config["specdec"] == {**extra, "sha256": hashlib.sha256((path / WEIGHTS).read_bytes()).hexdigest()}
    names = {"fc.weight", "fc.bias", "norm.weight", "lm_head.weight", "d2t", "t2d"}
    names |= {f"layers.0.{n}.weight" for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm")}
    names |= {f"layers.0.self_attn.{p}_proj.weight" for p in "qkvo"}
    names |= {f"layers.0.mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
    with safe_open(path / WEIGHTS, "pt") as f:
        assert set(f.keys()) == names and f.metadata() == {"format": "pt"}
    assert sorted(p.name for p in path.iterdir()) == [CONFIG, WEIGHTS]


def test_returned_sha256_is_the_hash_of_the_weights_file(tmp_path, target):
    path = tmp_path / "head"
    sha = save_head(make_head(target), path)
    assert sha == hashlib.sha256((path / WEIGHTS).read_bytes()).hexdigest()


def test_own_embedding_head_round_trips_and_embeds_with_its_own_table(tmp_path, target):
    head = make_head(target, own_embedding=True)
    loaded = load_head(saved(tmp_path, head), target)
    assert_same_state(loaded, head.state_dict())
    ids = torch.tensor([[3, 50, 95]])
    assert torch.equal(loaded.embed(ids), head.embed_tokens(ids).double())
    assert not torch.equal(loaded.embed(ids), target.get_input_embeddings()(ids))


# ---- the original EAGLE-3 / SpecForge format ------------------------------------------------------
def write_specforge(folder: Path, head: Eagle3Head, layer_ids: str, weights: str, vocabulary: bool = True) -> None:
    """A head as SpecForge saves it: a llama config, the layer under ``midlayer.``; ``layer_ids`` where
    the aux layers are written (SpecForge's ids: the layer whose output is read, one less)."""
    c = head.config
    config = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": c.hidden_size,
        "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
        "intermediate_size": c.intermediate_size, "vocab_size": c.target_vocab_size,
        "draft_vocab_size": c.draft_vocab_size, "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta,
        "max_position_embeddings": c.max_position_embeddings, "num_hidden_layers": 1, "hidden_act": "silu",
        "tie_word_embeddings": False, "torch_dtype": "float32",
    }
    ids = [k - 1 for k in c.aux_layers]
    if layer_ids == "eagle_config":
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True}
    elif layer_ids == "top-level":
        config["eagle_aux_hidden_state_layer_ids"] = ids
    tensors = {k.replace("layers.0.", "midlayer.", 1): v.clone() for k, v in head.state_dict().items()}
    if not vocabulary:
        del tensors["d2t"], tensors["t2d"]
    folder.mkdir()
    (folder / CONFIG).write_text(json.dumps(config))
    if weights == "safetensors":
        save_file(tensors, folder / WEIGHTS)
    else:
        torch.save(tensors, folder / "pytorch_model.bin")


@pytest.mark.parametrize("weights", ["safetensors", "bin"])
@pytest.mark.parametrize("layer_ids", ["eagle_config", "top-level", "absent"])
def test_specforge_folder_loads_to_the_same_head_with_its_aux_layers(tmp_path, target, layer_ids, weights):
    head = make_head(target, **({} if layer_ids == "absent" else {"aux_layers": (1, 3, 2)}))
    write_specforge(tmp_path / "specforge", head, layer_ids, weights)
    loaded = load_head(tmp_path / "specforge", target)
    assert loaded.config == head.config  # absent ids: EAGLE-3's default layers of the target
    assert_same_state(loaded, head.state_dict())
    torch.testing.assert_close(outputs(loaded), outputs(copy.deepcopy(head).double()), rtol=0, atol=0)


def test_head_over_the_whole_vocabulary_without_d2t_loads_with_the_identity_mapping(tmp_path, target):
    config = HeadConfig.for_target(target, draft_vocab_size=96)
    head = Eagle3Head(config, embed_tokens=target.get_input_embeddings())
    head.set_vocabulary(torch.arange(96))
    write_specforge(tmp_path / "full", head, "absent", "safetensors", vocabulary=False)
    loaded = load_head(tmp_path / "full", target)
    assert torch.equal(loaded.target_ids(), torch.arange(96)) and bool(loaded.t2d.all())


# ---- refusals -----------------------------------------------------------------------------------
def _other_vocabulary(tmp, target):
    return saved(tmp, make_head(llama(vocab=128, layers=4)))


def _edited(tensors=None, config=None, seal=True):
    def build(tmp, target):
        path = saved(tmp, make_head(target))
        edit(path, tensors, config, seal)
        return path
    return build


def _removed(name):
    def build(tmp, target):
        path = saved(tmp, make_head(target))
        (path / name).unlink()
        return path
    return build


def _config_text(text):
    def build(tmp, target):
        path = saved(tmp, make_head(target))
        (path / CONFIG).write_text(text)
        return path
    return build


def _truncated(tmp, target):
    path = saved(tmp, make_head(target))
    edit(path, config=lambda c: c.pop("specdec"), seal=False)
    (path / WEIGHTS).write_bytes((path / WEIGHTS).read_bytes()[:100])
    return path


def _changed(**changes):
    return lambda tmp, target: saved(tmp, make_head(target, **changes))


def _tensor_set(name, value):
    return _edited(tensors=lambda w: w.update({name: value}))


# case: (what builds the folder from (tmp_path, target), what the one line must contain)
REFUSALS = {
    "target-hidden-size": (_changed(target_hidden_size=48), ["target hidden size", "48", "32"]),
    "vocabulary": (_other_vocabulary, ["vocabulary", "128", "96"]),
    "t2d-length": (_tensor_set("t2d", torch.zeros(100, dtype=torch.bool)), ["vocabulary", "t2d", "100", "96"]),
    "aux-layer": (_changed(aux_layers=(1, 2, 4)), ["aux layer 4", "4 layers"]),
    "embedding-width": (_changed(hidden_size=48), ["hidden size 48", "embedding", "32 wide"]),
    "no-folder": (lambda tmp, t: tmp / "absent", ["no such folder"]),
    "no-config": (_removed(CONFIG), ["no config.json"]),
    "no-weights": (_removed(WEIGHTS), ["no model.safetensors or pytorch_model.bin"]),
    "unreadable-json": (_config_text("{not json"), ["config.json is not readable JSON"]),
    "neither-format": (_config_text('{"model_type": "bert", "hidden_size": 32}'), ["neither"]),
    "other-speculator": (_config_text('{"speculators_model_type": "eagle"}'), ["neither", "'eagle'"]),
    "missing-tensor": (_edited(tensors=lambda w: w.pop("layers.0.mlp.up_proj.weight")),
                       ["layers.0.mlp.up_proj.weight", "missing"]),
    "wrong-shape": (_tensor_set("norm.weight", torch.ones(31)), ["norm.weight", "[31]", "[32]"]),
    "unknown-tensor": (_tensor_set("layers.1.mlp.up_proj.weight", torch.ones(2)), ["layers.1.mlp.up_proj.weight"]),
    "unsupported-option": (_edited(config=lambda c: c.update(norm_before_fc=True)), ["norm_before_fc"]),
    "d2t-outside": (_edited(tensors=lambda w: w["d2t"].__setitem__(0, 1000)), ["d2t", "1000", "96"]),
    "damaged-weights": (_edited(tensors=lambda w: w["norm.weight"].mul_(2), seal=False), ["sha256"]),
    "truncated-weights": (_truncated, ["model.safetensors is not readable"]),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_unfit_or_broken_head_is_refused_with_one_line_naming_the_mismatch_and_nothing_changes(
        tmp_path, target, case):
    build, fragments = REFUSALS[case]
    path = build(tmp_path, target)
    before, listing = snapshot(path), sorted(p.name for p in tmp_path.iterdir())
    target_before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(ValueError) as refused:
        load_head(path, target)
    message = str(refused.value)
    assert "\n" not in message and all(f in message for f in fragments), message
    assert snapshot(path) == before and sorted(p.name for p in tmp_path.iterdir()) == listing
    assert all(torch.equal(v, target_before[k]) for k, v in target.state_dict().items())


# ---- atomic writes ------------------------------------------------------------------------------
def test_save_that_cannot_write_its_config_leaves_no_folder_and_the_existing_one_untouched(tmp_path, target):
    with pytest.raises(ValueError) as refused:
        save_head(make_head(target), tmp_path / "new", extra={"bad": object()})
    assert "\n" not in str(refused.value) and "extra" in str(refused.value)
    assert list(tmp_path.iterdir()) == []
    path = saved(tmp_path, make_head(target))
    before = snapshot(path)
    with pytest.raises(ValueError):
        save_head(make_head(target, seed=1), path, extra={"nan": float("nan")})
    assert snapshot(path) == before and [p.name for p in tmp_path.iterdir()] == ["head"]


def test_interrupted_save_keeps_the_old_folder_whole_and_leaves_nothing_behind(tmp_path, target, monkeypatch):
    path = saved(tmp_path, make_head(target))
    before = snapshot(path)

    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(fmt.os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_head(make_head(target, seed=1), path)
    assert snapshot(path) == before and [p.name for p in tmp_path.iterdir()] == ["head"]


@pytest.fixture(params=["exchange", "move-aside"])
def swap(request, monkeypatch):
    """Both ways of replacing a folder: the atomic exchange, and the fallback where it is unsupported."""
    if request.param == "move-aside":
        monkeypatch.setattr(fmt, "_exchange", lambda a, b: False)
    return request.param


def test_save_over_an_existing_folder_replaces_it_whole(tmp_path, target, swap):
    first, second = make_head(target, seed=0), make_head(target, seed=1)
    saved(tmp_path, first)
    path = saved(tmp_path, second)
    assert_same_state(load_head(path, target), second.state_dict())
    assert [p.name for p in tmp_path.iterdir()] == ["head"]


def _one_of(loaded: Eagle3Head, states: list) -> bool:
    state = loaded.state_dict()
    return any(all(torch.equal(state[k], s[k].to(state[k].dtype)) for k in s) for s in states)


def _save_repeatedly(head, path, times):
    torch.set_num_threads(1)
    for _ in range(times):
        save_head(head, path, dtype=torch.float32)


def test_concurrent_saves_leave_one_complete_loadable_folder_and_readers_never_see_a_partial_one(
        tmp_path, target, swap):
    heads = [make_head(target, seed=s) for s in (1, 2)]
    states = [h.state_dict() for h in heads]
    path = saved(tmp_path, make_head(target, seed=0))
    states.append(make_head(target, seed=0).state_dict())
    context = multiprocessing.get_context("fork")
    writers = [context.Process(target=_save_repeatedly, args=(h, path, 15)) for h in heads]
    for w in writers:
        w.start()
    while any(w.is_alive() for w in writers):
        if swap == "exchange":  # without the exchange a reader may find no folder for a moment
            assert _one_of(load_head(path, target), states)
    for w in writers:
        w.join()
        assert w.exitcode == 0
    assert _one_of(load_head(path, target), states[:2])
    assert [p.name for p in tmp_path.iterdir()] == ["head"]
