"""Every source of drafts, one file each, behind one base class (``drafters.base.Drafter``).

A new drafter is one file here plus one strategy row (``strategies.register``); see
docs/adding-a-drafter.md. The verification loops are in ``sampling``; ``sampling.generate`` runs
any drafter through them.
"""
from drafters.base import UNLIMITED, Drafter, as_drafter, write_drafts
from drafters.chained import ChainedDrafter
from drafters.model import ModelDrafter
from drafters.ngram import NGramDrafter, TensorStorageDrafter, ngram_drafter, ngram_tree_drafter
from drafters.prompt_lookup import PromptLookupDrafter, lookup_continuation
from drafters.recycling import RecyclingDrafter, tree_template
from drafters.suffix import SuffixDrafter, SuffixSettings

__all__ = [
    "UNLIMITED", "Drafter", "as_drafter", "write_drafts", "ChainedDrafter", "ModelDrafter", "NGramDrafter",
    "TensorStorageDrafter", "ngram_drafter", "ngram_tree_drafter", "PromptLookupDrafter", "lookup_continuation",
    "RecyclingDrafter", "tree_template", "SuffixDrafter", "SuffixSettings",
]
