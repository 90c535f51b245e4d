"""What a model accepts and returns: its context window and the rows of its output layer."""
from torch.nn import Module

_WINDOW_ATTRIBUTES = ("max_position_embeddings", "n_positions", "max_context_length", "max_sequence_length")


def context_window(model: Module) -> int | None:
    """Largest number of positions the model accepts, or None when its config sets no limit (e.g. T5)."""
    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        config = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    for name in _WINDOW_ATTRIBUTES:
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def output_vocab_size(model: Module) -> int:
    """Number of rows of the model's output layer (its logits' last dimension)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if isinstance(getattr(head, "out_features", None), int):  # read before .weight, which a quantized layer rebuilds
        return head.out_features
    if head is not None and getattr(head, "weight", None) is not None:
        return head.weight.shape[0]
    return model.config.get_text_config(decoder=True).vocab_size


def common_vocab_size(drafter: Module, target: Module, tokenizer=None) -> int:
    """Vocabulary size that drafter and target share.

    Equal output sizes are used as they are. Sizes that differ only by padding rows of the
    output layer (both at least the tokenizer's length) are cut to the smaller one; any
    other difference is refused, because the two models would not be speaking of the same tokens.
    """
    drafter_size, target_size = output_vocab_size(drafter), output_vocab_size(target)
    if drafter_size == target_size:
        return target_size
    if tokenizer is not None and min(drafter_size, target_size) >= len(tokenizer):
        return min(drafter_size, target_size)
    hint = "" if tokenizer is not None else " (pass tokenizer= to use the common part when they differ only by padding)"
    raise ValueError(
        f"drafter and target vocabularies differ: {drafter_size} vs {target_size} output rows{hint}"
    )
