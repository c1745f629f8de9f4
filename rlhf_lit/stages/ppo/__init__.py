"""PPO with a per-token KL penalty to the frozen SFT model: the third InstructGPT stage.

The package: :mod:`~rlhf_lit.stages.ppo.module` (``PPOModule``, the LightningModule and its
``training_step``), :mod:`~rlhf_lit.stages.ppo.building` (its models, KL controller and optimizers),
:mod:`~rlhf_lit.stages.ppo.checkpointing` (its checkpoint and resume hooks),
:mod:`~rlhf_lit.stages.ppo.experience` (prompts -> a scored rollout),
:mod:`~rlhf_lit.stages.ppo.protocols` (what the experience maker and the update read of the stage),
:mod:`~rlhf_lit.stages.ppo.loss` (the minibatch loss), :mod:`~rlhf_lit.stages.ppo.update` (K epochs
of minibatch steps), :mod:`~rlhf_lit.stages.ppo.config` (the ``ppo`` / ``reward`` / ``kl`` groups),
:mod:`~rlhf_lit.stages.ppo.checks` (settings that contradict each other),
:mod:`~rlhf_lit.stages.ppo.seeding`, :mod:`~rlhf_lit.stages.ppo.estimator`,
:mod:`~rlhf_lit.stages.ppo.reward_sources`, :mod:`~rlhf_lit.stages.ppo.reference_calibration`,
:mod:`~rlhf_lit.stages.ppo.rollout`,
:mod:`~rlhf_lit.stages.ppo.ranks` (sums over the processes) and :mod:`~rlhf_lit.stages.ppo.metrics`.

One ``training_step`` is one rollout: generate -> score -> rewards -> GAE -> K epochs of clipped
updates -> KL controller -> metrics. Manual optimization; the module owns the whole update.

Implementation details followed (N = "The N Implementation Details of RLHF with PPO", Huang et
al. 2022 blog; N+ = "The N+ Implementation Details of RLHF with PPO", Huang et al. 2024; "N detail
k" is the k-th item of the blog's list):

- Reward = RM score at the last response token (EOS included) plus ``-beta * KL`` per token
  (Ziegler et al. 2019; Ouyang et al. 2022; N detail 10). RM and critic read query + response (N detail 1).
  With ``kl.mode: loss`` the KL is a loss term instead (GRPO, Shao et al. 2024; token mean), by
  default k3 times the ratio pi / pi_old, whose gradient is the reverse KL's on every minibatch
  (Tang and Munos 2025, "On a few pitfalls in KL divergence gradient estimation for RL"); GRPO's
  plain k3 (``kl.loss_estimator: k3``) differentiates to the forward KL's gradient.
- Stop at EOS; tokens after the first EOS are set to pad and masked (N+ / N detail 3). "EOS" is every
  stop id of the policy (:func:`~rlhf_lit.models.generation.stop_token_ids`: the tokenizer's and
  the ``generation_config`` list chat models carry), for sampling, masks, the RM score position
  and the missing-EOS penalty alike. Masks come from
  EOS positions, never from pad ids; ``position_ids = cumsum(mask) - 1`` in every forward pass so
  left-padded rows see the positions ``generate`` used (N detail 2).
- Logits are divided by the sampling temperature whenever logprobs are computed (N detail 7), so the
  ratio is exactly 1 on the first minibatch.
- Dropout off in policy, reference, RM and critic (N detail 8; done by the loaders, and it stays off in
  train mode: ``nn.Dropout`` modules and the attention dropout rates Llama-family code reads).
- Missing-EOS penalty replaces the score (N+ / N detail 9); optional score bias, whitening, clipping,
  and TRL-style reward whitening without re-centring (N details 5 and 12).
- Adaptive KL controller (Ziegler et al. 2019; N detail 11: error clipped to +-0.2) or fixed (N+), fed
  with the KL per response (summed over tokens) averaged over all ranks, and the global sample
  count. Its target is in nats, so it takes only the ``k1`` / ``k3`` estimators.
- GAE with gamma 1, lambda 0.95 by default; advantages whitened over the batch (N detail 12; cleanrl).
- Whitening over the global batch: with several processes every whitening (GAE advantages,
  REINFORCE++ returns, ``reward.whiten``) takes its mean and variance over the rows of all ranks
  (``ppo.whiten_scope: global``, the default; two small all-reduces each), so the update does not
  depend on the number of processes, and REINFORCE++ whitens over the global batch as its paper
  does. ``whiten_scope: rank`` whitens each rank's rows, as TRL does.
- Clipped value loss, vf_coef 0.1 (N detail 13); the critic is a separate model initialised from the
  RM (N+ detail 16) with a zeroed head when new (N detail 4), or a zeroed head on the policy's trunk. A
  critic from an RM whose normalisation bias lives in ``config.reward_bias`` (Llama) adds it to
  every value, as the reward does, so its last-token value starts equal to the reward.
- A reward-model ensemble as the RM (Coste et al. 2023): the members' scores, each normalised on
  its own by the RM stage, become the score by the source's ``aggregate`` (``mean``,
  ``uncertainty_weighted``: mean - lam * population std, ``worst_case``: the minimum;
  :func:`rlhf_lit.functional.aggregate_scores`), before bias, whitening and clipping; a separate
  critic without ``value_model`` starts from member 0.
- A calibrated reward (``reward.calibration: reference_quantile``; BoNBoN, Gui et al. 2024; InfAlign,
  Balashankar et al. 2025): the raw score replaced by its mid-quantile among K samples of the frozen
  reference for the same prompt, drawn each rollout from their own seed stream, then ``identity``,
  ``log`` or ``best_of_n`` (:mod:`~rlhf_lit.stages.ppo.reference_calibration`); with ``log`` and a
  fixed KL coefficient 1 / (n - 1) the optimum is the best-of-n policy. K more responses are
  sampled and scored per prompt.
- Adam eps configurable (N detail 15: PyTorch placement; default 1e-5 as in cleanrl / N+).
- Per-process seeds ``seed + rank * 100003`` (N detail 14), folded with the rollout index and a stream
  id into fresh generators, so sampling and shuffling are reproducible and resume exactly. The
  seed is ``rollout_seed``, or the run's ``seed_everything`` when it is unset (the default).
- Optional entropy bonus (cleanrl) and PPO-ptx (Ouyang et al. 2022, eq. 2).
- ``ppo.estimator`` (:mod:`rlhf_lit.stages.ppo.estimator`, the one place it is read): ``gae`` above,
  or critic-free GRPO (Shao et al. 2024), Dr. GRPO (Liu et al. 2025), RLOO (Ahmadian et al.
  2024) and REINFORCE++ (Hu 2025), which build no critic and have one optimizer. With
  ``sampling.samples_per_prompt = k`` each prompt is repeated k times as consecutive rows before
  generation (TRL's layout); the group estimators score the sequence reward ``rewards.sum(1)``.
- ``ppo.policy_loss`` (:mod:`rlhf_lit.functional.policy_losses`, read only by
  :func:`~rlhf_lit.stages.ppo.loss.ppo_loss`): ``clipped``, the clipped surrogate (Schulman et al.
  2017, eq. 7), a token mean; a variant is one function of the same signature and its name there.

Departures from textbook PPO (Schulman et al. 2017) and their reasons:

- The "environment" is one response; the value of the state before token t is read at position
  ``P - 1 + t`` and the episode ends after the last response token (value 0), as in TRL / N+.
- Data position: after each rollout ``trainer.datamodule.mark_consumed(B * world_size)`` (when the
  data module has it); Lightning stores ``datamodule.state_dict()`` in checkpoints and restores it
  before the train loader is built, so a resumed run continues with the prompts not yet used
  (tested across an epoch boundary). The rollout counter, the KL controller and the global RNG go
  in ``checkpoint["ppo"]``; sampling and shuffling seeds are folded from (seed, rank, rollout).
- Logprobs use the full softmax even with top-k / top-p sampling (as TRL, OpenRLHF): ratio 1
  still holds, the importance weight is of the untruncated policy.
- Losses are token means over a minibatch (cleanrl / TRL), not per-sequence means; with several
  processes, over the tokens of that minibatch on every rank (a rank with short responses does not
  weigh more).
- The learning-rate schedule is stepped once per rollout (``warmup_steps`` and the decay count
  rollouts), not per optimizer step. Lightning's ``global_step`` counts every ``opt.step()``
  (of both optimizers), so this module keeps ``rollout_index`` and stops with ``max_rollouts``
  (``trainer.should_stop``); metrics are logged with ``step = rollout_index``.
- With ``critic="shared_trunk"`` there is one optimizer (policy and head parameters together);
  with ``separate`` two (policy, critic). Gradient accumulation divides each minibatch loss by
  ``grad_accum``; one ``manual_backward`` on the summed loss per minibatch (DDP sees every
  parameter).
- fp16 (``16-mixed``) with two optimizers: the loss scale is updated once after both stepped
  (PyTorch's AMP recipe for several optimizers), not after each as Lightning's plugin would, so
  the critic's gradients are unscaled with the scale they were scaled with
  (:mod:`rlhf_lit.stages.amp`).
"""

from rlhf_lit.stages.ppo.config import KLConfig, PPOConfig, RewardConfig, RewardSource
from rlhf_lit.stages.ppo.module import PPOModule

__all__ = ["KLConfig", "PPOConfig", "PPOModule", "RewardConfig", "RewardSource"]
