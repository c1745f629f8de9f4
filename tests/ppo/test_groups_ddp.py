"""GRPO groups under DDP: each rank forms the groups of its own prompts; no group spans two ranks."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.slow
def test_each_group_is_whole_on_the_rank_of_its_prompt(two_process_run):
    """groups_worker.py's part of the two-process launch (``two_process_run``)."""
    for rank in (0, 1):
        record = torch.load(two_process_run / "groups" / f"rank{rank}.pt", weights_only=False)
        batch = record["batch"]
        assert record["prompts"].shape[0] == 4  # 2 prompts x k = 2
        # The data position counts prompts, not rows: 2 prompts on each of 2 ranks.
        assert record["consumed"] == [4]
        for g in range(2):
            prompt = 2 * rank + g  # the global prompt this group belongs to
            for row in (2 * g, 2 * g + 1):  # its k rows are consecutive, on this rank
                # the prompt's real tokens (the rollout drops the padding columns no prompt of the rank attends)
                real, wanted = record["prompt_mask"][row].bool(), batch["attention_mask"][prompt].bool()
                assert torch.equal(record["prompts"][row][real], batch["input_ids"][prompt][wanted])
            # GRPO within the group: (score - group mean) / (group std + 1e-4) on every response token.
            scores = record["scores"][2 * g : 2 * g + 2]
            expected = (scores - scores.mean()) / (scores.std() + 1e-4)
            for i, row in enumerate((2 * g, 2 * g + 1)):
                mask = record["mask"][row]
                torch.testing.assert_close(
                    record["advantages"][row][mask], expected[i].expand(int(mask.sum())), rtol=1e-5, atol=1e-6
                )
