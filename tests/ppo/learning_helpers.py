"""The setup of PPO's learning tests: a reward that counts a chosen token, and the per-rollout curves of a fit.

Shared by tests/ppo/test_learning.py (full fine-tune) and tests/ppo/test_lora_learning.py (LoRA).
"""

from __future__ import annotations

import torch
from ppo_helpers import TINYSTORIES, tiny_trainer

from rlhf_lit.data import PromptDataModule
from rlhf_lit.stages.ppo import PPOModule

ROLLOUTS = 40


class CountingPPO(PPOModule):
    """The reward is the number of times ``target`` appears in the response (EOS masking respected).

    Counted when the responses are generated and looked up by each row's real tokens when the
    reward model is asked: the scoring passes read rows trimmed of padding and in another order
    (length-sorted chunks, the update's first minibatch), so no fixed column marks where a response starts.
    """

    target: int

    def generate(self, batch):
        gen = super().generate(batch)
        counts = ((gen.response_ids == self.target) & gen.response_mask).sum(1).tolist()  # (B,)
        rows = zip(gen.query_responses.tolist(), gen.attention_mask.tolist(), counts)
        self._counts = {tuple(t for t, m in zip(ids, mask) if m): n for ids, mask, n in rows}
        return gen

    def score(self, query_responses, attention_mask):
        counts = []
        for ids, mask in zip(query_responses.tolist(), attention_mask.tolist()):
            real = tuple(t for t, m in zip(ids, mask) if m)
            # reward.unfinished with_eos: an unfinished response is read with one EOS appended
            counts.append(self._counts[real] if real in self._counts else self._counts[real[:-1]])
        return torch.tensor(counts, dtype=torch.float32, device=query_responses.device)  # (B,)


def fit_curves(
    module: PPOModule,
    tmp_path,
    seed: int,
    *,
    kind: type[CountingPPO],
    records: int,
    batch_size: int,
    rollouts: int,
    tags: tuple[str, ...],
) -> tuple[list[float], ...]:
    """Fit ``module`` as ``kind`` (rewarded for "."); each of ``tags`` per rollout."""
    module.__class__ = kind
    module.target = module.tokenizer.convert_tokens_to_ids(".")
    data = PromptDataModule(
        tokenizer=module.tokenizer,
        train_path=TINYSTORIES,
        format="paragraphs",
        max_records=records,
        batch_size=batch_size,
        prompt_words=6,
        seed=seed,
    )
    trainer = tiny_trainer(tmp_path)
    trainer.fit(module, data)
    history = trainer.logger.history
    return tuple([history[i][tag] for i in range(rollouts)] for tag in tags)


def learning_curves(module: PPOModule, tmp_path, seed: int) -> tuple[list[float], ...]:
    """Fit ``module`` (rewarded for ".") for ROLLOUTS rollouts; the shaped objective, score and KL per rollout."""
    return fit_curves(
        module,
        tmp_path,
        seed,
        kind=CountingPPO,
        records=256,
        batch_size=16,
        rollouts=ROLLOUTS,
        tags=("objective/rlhf_reward", "objective/scores", "objective/kl"),
    )


def mean_of(values: list[float]) -> float:
    """The arithmetic mean of ``values``."""
    return sum(values) / len(values)
