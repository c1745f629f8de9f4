"""Offline demo tooling: a gold judge, synthetic preferences, evaluation and a report.

Not part of the installed package: ``demo/`` sits at the root of a clone beside the ``assets/`` and
``configs/`` it reads (:data:`demo.plan.ROOT`), and its commands run from there (``python -m demo
...``, ``make demo``). It uses the library and runs ``rlhf-lit`` as a user does; the library never
imports it. :mod:`demo.runner` is the runner the pipeline and every study share.

The demo replays the InstructGPT recipe on TinyStories with a sentiment judge (VADER) standing in
for human labellers: sample completions from the SFT model, let the judge pick preferences, train
the reward model on them, run PPO (and DPO on the same pairs, best-of-N against the same RM), then
measure the judge score against the KL to the SFT model (:mod:`demo.frontier`).

Subcommands (``python -m demo --help``; the pipeline and the studies: ``pipeline``, ``seeds``,
``rm-study``, ``guard``, ``diversity``):

- ``split``: write the disjoint paragraph ranges below as ``sft.txt``, ``reward_model.txt``, ``ppo.txt``,
  ``eval.txt`` (input for the data modules' ``paragraphs`` format; ``sft.txt`` without the paragraphs of at
  most 8 words, which that format skips, so SFT's ``val_fraction`` split draws over its examples);
- ``preferences``: sample K completions per prompt and write a preference JSONL (format ``fields``);
- ``evaluate``: judge score, KL to the reference, distinct-n and length on held-out prompts;
- ``report``: PNG plots from a PPO TensorBoard run and a markdown summary.

Judges (:mod:`rlhf_lit.evaluation.judges`) score the response text only, without the prompt; the PPO
stage's judge logging should do the same so that its ``objective/judge`` matches ``evaluate``.

Paragraph ranges of ``assets/data/tinystories/val.txt`` (4,302 paragraphs), half-open
``[start, start + count)``, disjoint so that no stage sees another's prompts
(:data:`demo.story_prompts.RANGES`):

============ ============= ===== ==========================================================
stage        paragraphs    count use
============ ============= ===== ==========================================================
sft          0 - 999       1000  SFT demonstrations (prompt = first 8 words, response = rest)
reward_model 1000 - 2499   1500  prompts of the synthetic preference pairs
ppo          2500 - 2999   500   PPO prompts
eval         3000 - 3255   256   held-out evaluation prompts (``evaluate``)
(spare)      3256 - 4301   1046  unused
============ ============= ===== ==========================================================
"""
