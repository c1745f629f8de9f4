"""The raw score of a rollout: the weighted sum of the configured reward sources.

``reward.sources`` names the learned reward model (``function: null``) and/or reward functions
(``module:function``, :mod:`rlhf_lit.rewards`). :class:`RewardSources` loads the functions once
(a bad spec fails before any model is loaded) and, per rollout, turns the reward model's scores
and the decoded batch into one raw score per response plus the named parts that are logged as
``reward/<name>``. The raw score then takes the one placement path every score takes
(``RewardConfig.shape``, then :func:`~rlhf_lit.functional.kl_penalized_rewards` at the last
response token), so a function's reward lands exactly where the reward model's does.
"""

from __future__ import annotations

from typing import Any

import torch

from rlhf_lit.evaluation import prompt_texts, response_texts
from rlhf_lit.functional import aggregate_scores, member_std
from rlhf_lit.models.generation import Generated
from rlhf_lit.rewards import RewardBatch, load_reward_function
from rlhf_lit.stages.ppo.config import RewardSource


class RewardSources:
    """The configured sources, loaded.

    Args:
        sources: ``reward.sources``.
    """

    def __init__(self, sources: list[RewardSource]) -> None:
        self.sources = sources
        self.functions = {
            s.name: load_reward_function(s.function, s.kwargs, s.name) for s in sources if s.function is not None
        }

    @property
    def needs_texts(self) -> bool:
        """Whether a reward function is configured (the batch is then decoded for it)."""
        return bool(self.functions)

    def __call__(
        self, rm_scores: torch.Tensor | None, batch: RewardBatch | None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``(raw_scores (B,), parts)``: ``sum(weight * source score)`` and, for logging, each source's
        unweighted score (``reward/<name>``) and each dict component (``reward/<name>/<key>``).

        A reward-model ensemble's ``(B, M)`` member scores become the source's score by its
        ``aggregate``; each member's score is logged as ``reward/<name>/member_<m>`` and the members'
        population std as ``reward/<name>/std``.

        Args:
            rm_scores: ``(B,)`` reward-model scores, ``(B, M)`` for an ensemble (None when no source
                is the reward model).
            batch: the decoded batch for the reward functions (None when there are none).
        """
        total: torch.Tensor | None = None
        parts: dict[str, torch.Tensor] = {}
        for source in self.sources:
            if source.function is None:
                assert rm_scores is not None
                score = rm_scores  # (B,)
                if rm_scores.dim() == 2:  # an ensemble: (B, M) normalised member scores
                    score = aggregate_scores(rm_scores, source.aggregate, source.lam or 0.0)  # (B,)
                    members = {f"reward/{source.name}/member_{m}": rm_scores[:, m] for m in range(rm_scores.shape[1])}
                    parts.update(members)
                    parts[f"reward/{source.name}/std"] = member_std(rm_scores)  # (B,)
            else:
                assert batch is not None
                components = self.functions[source.name](batch)  # {name[/key]: (B,)} checked, CPU
                if len(components) > 1 or source.name not in components:
                    parts.update({f"reward/{k}": v for k, v in components.items()})
                score = torch.stack(list(components.values())).sum(0)  # (B,)
                device = rm_scores.device if rm_scores is not None else score.device
                score = score.to(device)  # (B,)
            parts[f"reward/{source.name}"] = score
            term = source.weight * score  # (B,); 1.0 * x is x: the default stays bit-identical
            total = term if total is None else total + term  # (B,)
        assert total is not None
        return total, parts


def reward_batch(tokenizer: Any, batch: dict[str, Any], gen: Generated) -> RewardBatch:
    """What a reward function sees of a rollout (prompts, responses, their ids up to EOS, EOS flags,
    the data module's extra columns), one entry per row of ``gen``."""
    prompts = prompt_texts(tokenizer, gen, skip_special_tokens=True)
    responses = response_texts(tokenizer, gen.query_responses, gen.attention_mask, gen.response_mask, gen.ended)
    response_ids = [ids[m].tolist() for ids, m in zip(gen.response_ids.cpu(), gen.response_mask.cpu())]
    extras = {name: list(column) for name, column in batch.get("extras", {}).items()}
    return RewardBatch(prompts, responses, response_ids, gen.ended.tolist(), extras)


def reward_model_unused(arg: str, init_args) -> bool:
    """``--run_dir`` leaves ``reward_model`` unset when no ``reward.sources`` entry is the reward model."""
    if arg != "reward_model":
        return False
    reward = init_args.get("reward")
    reward = reward.as_dict() if hasattr(reward, "as_dict") else dict(reward or {})
    sources = reward.get("sources") or [{"function": None}]  # the default source is the reward model
    return all(dict(source).get("function") is not None for source in sources)
