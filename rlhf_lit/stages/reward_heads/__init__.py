"""Reward heads: the variants of the reward model behind one protocol
(:class:`~rlhf_lit.stages.reward_heads.head.RewardHead`), one file each, chosen in
:mod:`rlhf_lit.stages.reward_heads.registry`; the stage (:mod:`rlhf_lit.stages.reward_model`) calls
the head it was given and never asks which one it is."""
