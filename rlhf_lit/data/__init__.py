"""LightningDataModules for the three shapes of RLHF data (batch formats: docs/CONTRACTS.md).

- :class:`SFTDataModule`: (prompt, response) demonstrations, labels on the response only.
- :class:`PreferenceDataModule`: (prompt, chosen, rejected[, margin]) pairs or (prompt, K ranked
  responses) rankings for the reward model, and
  an optional reference set of demonstrations for reward normalisation.
- :class:`PromptDataModule`: left padded prompts for PPO, with an exactly resumable sampler, and
  an optional second source of SFT batches for PPO-ptx.

Sources are local files (.jsonl, .json, .txt paragraphs, optionally .gz) or hub dataset names;
the record formats are the registry :data:`.adapters.ADAPTERS` (each described in :mod:`.adapters`;
HH-RLHF transcripts in :mod:`.hh`, rendered as ``hh_render`` says: :mod:`.rendering`), ``auto`` (the
default) in :mod:`.detect`, conversations in :mod:`.conversation`; one path from a source to examples in
:mod:`.reading`. Prompts given to a policy outside these modules (``rlhf-lit evaluate``, ``best-of-n``,
``iterate``, the callbacks) are read by :mod:`.prompt_source` (the same reader, or a fit config's own data
module) and rendered by :mod:`.prompt_rendering`.
"""

from rlhf_lit.data.adapters import ALPACA_PROMPT, ALPACA_PROMPT_NO_INPUT, Fields, Format
from rlhf_lit.data.collate import (
    PreferenceCollator,
    PromptCollator,
    RankingCollator,
    SequenceCollator,
    SFTCollator,
    pad,
)
from rlhf_lit.data.preference import PreferenceDataModule
from rlhf_lit.data.prompts import PromptDataModule
from rlhf_lit.data.records import InvalidRecord, read_rows
from rlhf_lit.data.sampler import PassSampler, ResumableSampler
from rlhf_lit.data.sft import SFTDataModule
from rlhf_lit.functional.losses import IGNORE_INDEX

__all__ = [
    "ALPACA_PROMPT",
    "ALPACA_PROMPT_NO_INPUT",
    "IGNORE_INDEX",
    "Fields",
    "Format",
    "InvalidRecord",
    "PreferenceCollator",
    "PreferenceDataModule",
    "PromptCollator",
    "PromptDataModule",
    "PassSampler",
    "RankingCollator",
    "ResumableSampler",
    "SequenceCollator",
    "SFTCollator",
    "SFTDataModule",
    "pad",
    "read_rows",
]
