"""Moved: every drafter is in the ``drafters`` package now, one file each (``drafters.base.Drafter``
their base class). These names stay importable from here, as before."""
from drafters.base import UNLIMITED, Drafter, write_drafts as _write  # noqa: F401
from drafters.chained import ChainedDrafter  # noqa: F401
from drafters.model import ModelDrafter  # noqa: F401
from drafters.ngram import TREE_CHILDREN, NGramDrafter, TensorStorageDrafter, ngram_drafter  # noqa: F401
from drafters.prompt_lookup import PromptLookupDrafter, lookup_continuation  # noqa: F401
