"""Padding-free passes (rlhf_lit.models.packing): the packed layout by hand, packed passes against
padded ones on a rotary (Llama) and an absolute-position (GPT-2) model within float32 bounds, and
a model that cannot be packed keeping its padded pass."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM, GPT2Config, GPT2ForSequenceClassification

from rlhf_lit.models.packing import gather_rows, pack_rows, packs_correctly, padding_free
from rlhf_lit.models.scoring import token_scores
from rlhf_lit.models.teacher_forced import forward_response_logits
from tests.float32_bounds import output_bound

# Three rows: left-padded prompts of 2, 4 and 1 tokens (P = 4) and responses of 3, 1 and 3 tokens
# (R = 3; row 1 ended at once: its last two response columns are padding).
IDS = torch.tensor([[0, 0, 11, 12, 13, 14, 15], [21, 22, 23, 24, 25, 0, 0], [0, 0, 0, 31, 32, 33, 34]])
MASK = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0], [0, 0, 0, 1, 1, 1, 1]])
P = 4


def test_pack_rows_by_hand():
    rows = pack_rows(IDS, MASK)
    assert rows.input_ids.tolist() == [[11, 12, 13, 14, 15, 21, 22, 23, 24, 25, 31, 32, 33, 34]]
    assert rows.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2, 3]]
    assert rows.index.tolist() == [[-1, -1, 0, 1, 2, 3, 4], [5, 6, 7, 8, 9, -1, -1], [-1, -1, -1, 10, 11, 12, 13]]


def test_gather_rows_places_each_packed_row_and_carries_its_gradient():
    packed = torch.arange(6.0).view(3, 2).requires_grad_()  # (K=3, 2)
    index = torch.tensor([[2, -1], [0, 1]])
    out = gather_rows(packed, index)  # (2, 2, 2)
    assert out.tolist() == [[[4.0, 5.0], [0.0, 0.0]], [[0.0, 1.0], [2.0, 3.0]]]
    out.sum().backward()
    assert packed.grad.tolist() == [[1.0, 1.0]] * 3


def _predicting_real():
    """(B, R) bool: the logits of response token t are read where column P - 1 + t is a real token."""
    return MASK[:, P - 1 : -1].bool()


@pytest.fixture(scope="module")
def gpt2_scorer():
    torch.manual_seed(3)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=64, num_labels=1, pad_token_id=0)
    return GPT2ForSequenceClassification(config).eval()


@pytest.mark.parametrize("which", ["stories260K", "gpt2"])
def test_packed_logits_and_hidden_states_are_the_padded_ones(which, stories_path, gpt2_dir):
    # GPT-2's absolute positions come from position_ids alone: a packed row numbered on from the
    # previous row would move its logits; Llama's rotary positions are checked the same way.
    model = AutoModelForCausalLM.from_pretrained(stories_path if which == "stories260K" else gpt2_dir).eval()
    with torch.no_grad():
        padded, padded_out = forward_response_logits(model, IDS, MASK, P, output_hidden_states=True)
        with padding_free():
            packed, packed_out = forward_response_logits(model, IDS, MASK, P, output_hidden_states=True)
    assert packed.shape == padded.shape == (3, 3, model.config.vocab_size)
    read = _predicting_real()
    bound = output_bound(model.config, float(padded.abs().max()), IDS.shape[1])
    torch.testing.assert_close(packed[read], padded[read], rtol=0, atol=bound)
    assert bool((packed[~read] == 0).all())  # never read: after row 1 ended
    hidden, real = padded_out.hidden_states[-1], MASK.bool()
    assert packed_out.hidden_states[-1].shape == hidden.shape
    torch.testing.assert_close(
        packed_out.hidden_states[-1][real],
        hidden[real],
        rtol=0,
        atol=output_bound(model.config, float(hidden.abs().max()), IDS.shape[1]),
    )


def test_packed_token_scores_are_the_padded_ones(gpt2_scorer):
    with torch.no_grad():
        padded = token_scores(gpt2_scorer, IDS, MASK)
        with padding_free():
            packed = token_scores(gpt2_scorer, IDS, MASK)
    real = MASK.bool()
    bound = output_bound(gpt2_scorer.config, float(padded.abs().max()), IDS.shape[1])
    torch.testing.assert_close(packed[real], padded[real], rtol=0, atol=bound)
    assert bool((packed[~real] == 0).all())


def test_packed_pass_trains_the_same_gradient(stories_path):
    model = AutoModelForCausalLM.from_pretrained(stories_path)
    grads = []
    for packed in (False, True):
        model.zero_grad()
        with padding_free(packed):
            logits, _ = forward_response_logits(model, IDS, MASK, P)
        logits[_predicting_real()].logsumexp(-1).sum().backward()
        grads.append(model.model.layers[0].self_attn.q_proj.weight.grad.clone())
    scale = float(grads[0].abs().max())
    assert scale > 0
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=1e-4 * scale)  # a wrong row would move it by O(scale)


class PositionBlind(nn.Module):
    """A causal LM that drops ``position_ids`` (numbers tokens by column): a packed row would be read
    at the wrong positions, and its tokens attend to the rows before it."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner, self.config = inner, inner.config

    def get_input_embeddings(self):
        return self.inner.get_input_embeddings()

    def forward(self, input_ids, attention_mask=None, position_ids=None, **kwargs):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, **kwargs)


def test_a_model_that_cannot_be_packed_keeps_its_padded_pass_with_one_warning(gpt2_dir, caplog):
    blind = PositionBlind(AutoModelForCausalLM.from_pretrained(gpt2_dir).eval())
    with caplog.at_level(logging.WARNING, logger="rlhf_lit.models.packing"):
        assert not packs_correctly(blind)
        with torch.no_grad():
            padded, _ = forward_response_logits(blind, IDS, MASK, P)
            with padding_free():
                kept, _ = forward_response_logits(blind, IDS, MASK, P)
                forward_response_logits(blind, IDS, MASK, P)
    assert torch.equal(kept, padded)
    warnings = [r for r in caplog.records if "does not pack rows correctly" in r.getMessage()]
    assert len(warnings) == 1 and "PositionBlind" in warnings[0].getMessage()


def test_real_architectures_pass_the_packing_check(stories_path, gpt2_dir, gpt2_scorer):
    for path in (stories_path, gpt2_dir):
        assert packs_correctly(AutoModelForCausalLM.from_pretrained(path).eval())
    assert packs_correctly(gpt2_scorer)
