"""A drafter described by its values (a *spec*), and the live objects it may draw on (a ``DraftContext``).

A spec is a small frozen dataclass beside its drafter (``PromptLookupSpec`` in ``drafters/prompt_lookup.py``,
``SuffixSpec`` in ``drafters/suffix.py``, ...): it prints, compares, hashes and is written as a dict;
its values are checked once, when it is made (one ValueError line). ``sampling.generate`` takes a
spec, asks it which ``GenerationConfig`` fields it sets (``prepare``: its draft budget, a shared
vocabulary, the tree loop) and, once the prompt and the room to generate are checked, makes the
``Drafter`` for that prompt (``make``). What a spec needs that is not a value (an n-gram storage, a
suffix memory, a drafter model, a head) is in the ``DraftContext`` given beside it, never in the spec:
a spec stays a value, and one context serves every spec of a run.
"""
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, List, Optional

from drafters.base import Drafter


@dataclass
class DraftContext:
    """The live objects drafters draw on; None: not given (a spec that needs one says so, in one line).

    ``tokenizer``: the target's (lets a drafter model whose output layer is only padded wider share
    the vocabulary; a drafter with its own tokenizer translates through it). ``drafter``: a drafter
    model; ``drafter_tokenizer``: its own tokenizer when it has another vocabulary; ``drafter_prompt``:
    ``prompt ids -> the drafter's ids`` (its own chat template's rendering; None: the prompt's text
    re-encoded). ``storage``: an n-gram storage. ``memory``: a global memory over earlier outputs
    (``SuffixMemory``; the arctic drafter's ``SuffixDecodingCache``). ``head``: a learned EAGLE-3 head.
    ``table``: token recycling's adjacency table, kept across generations (None: a fresh one each).
    ``encoder_input_ids``: an encoder-decoder pair's encoder input (set by ``sampling.generate``)."""

    tokenizer: Any = None
    drafter: Any = None
    drafter_tokenizer: Any = None
    drafter_prompt: Optional[Callable[[List[int]], Optional[List[int]]]] = None
    storage: Any = None
    memory: Any = None
    head: Any = None
    table: Optional[dict] = None
    encoder_input_ids: Optional[List[int]] = None

    def need(self, name: str, what: str) -> Any:
        """The live object ``name``; ValueError (one line) naming ``what`` needs it when it is None."""
        value = getattr(self, name)
        if value is None:
            raise ValueError(f"{what} needs DraftContext.{name}")
        return value


@dataclass(frozen=True)
class DrafterSpec:
    """A drafter's values. Subclasses are frozen dataclasses that check their values in
    ``__post_init__`` and override ``make`` (and ``budget`` / ``prepare`` when they set the draft
    length or the vocabulary). ``trees``: the tree loop; a class attribute here (not a field), a
    field where a drafter drafts both chains and trees."""

    trees = False

    def budget(self) -> Optional[int]:
        """The most drafts (tree nodes) a step proposes; None: the generation's ``gamma``."""
        return None

    def prepare(self, target: Any, context: DraftContext) -> Dict[str, Any]:
        """The ``GenerationConfig`` fields this drafter sets for a generation on ``target``, after
        checking what it needs of ``context``: its budget as ``gamma``, and ``trees``."""
        budget = self.budget()
        return {"trees": self.trees, **({} if budget is None else {"gamma": budget})}

    def make(self, prompt: List[int], target: Any, config: Any, context: DraftContext) -> Drafter:
        """The drafter for one generation of ``prompt`` under ``config`` (a ``sampling.GenerationConfig``,
        read, not imported: the loops sit above the drafters)."""
        raise NotImplementedError

    def to_dict(self) -> Dict[str, Any]:
        """Its values, with its class's name under ``spec``."""
        return {"spec": type(self).__name__, **asdict(self), **({"trees": self.trees} if "trees" not in asdict(self) else {})}
