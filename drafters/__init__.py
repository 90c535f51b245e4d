"""Every source of drafts, one file each, behind one base class (``drafters.base.Drafter``), each
described by a frozen spec beside it (``drafters.spec.DrafterSpec``: ``PromptLookupSpec``, ``SuffixSpec``, ...).

A new drafter is one file here plus one strategy row (``strategies.register``); see
docs/adding-a-drafter.md. The verification loops are in ``sampling``; ``sampling.generate`` runs
any drafter, or any spec with the live objects of a ``DraftContext``, through them.
"""
from drafters.arctic import ArcticSpec
from drafters.base import UNLIMITED, Drafter, as_drafter, write_drafts
from drafters.chained import ChainedDrafter, ChainedSpec
from drafters.copy_tree import CopyTreeDrafter, CopyTreeSpec
from drafters.eagle import EagleDrafter, EagleSpec
from drafters.merged import MergedDrafter, MergedSpec
from drafters.model import ModelDrafter, ModelSpec
from drafters.ngram import NGramDrafter, NGramSpec, NGramTreeSpec, TensorStorageDrafter, ngram_drafter, ngram_tree_drafter
from drafters.prompt_lookup import PromptLookupDrafter, PromptLookupSpec, lookup_continuation
from drafters.recycling import RecyclingDrafter, RecyclingSpec, tree_template
from drafters.spec import DraftContext, DrafterSpec
from drafters.suffix import SuffixDrafter, SuffixSettings, SuffixSpec

__all__ = [
    "UNLIMITED", "Drafter", "as_drafter", "write_drafts", "DraftContext", "DrafterSpec", "ArcticSpec", "ChainedDrafter",
    "ChainedSpec", "CopyTreeDrafter", "CopyTreeSpec", "EagleDrafter", "EagleSpec", "MergedDrafter", "MergedSpec", "ModelDrafter", "ModelSpec", "NGramDrafter", "NGramSpec", "NGramTreeSpec", "TensorStorageDrafter", "ngram_drafter",
    "ngram_tree_drafter", "PromptLookupDrafter", "PromptLookupSpec", "lookup_continuation", "RecyclingDrafter", "RecyclingSpec",
    "tree_template", "SuffixDrafter", "SuffixSettings", "SuffixSpec",
]
