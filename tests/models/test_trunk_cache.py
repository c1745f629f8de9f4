"""cache_frozen's store of the frozen trunk (rlhf_lit.models.trunk_cache): a cached pass gives the plain
pass's outputs at every real token, under left and right padding; a row's kept value does not depend on
its batch; models of one frozen trunk share a store and a changed frozen weight does not; generation
and other calls run the blocks as before; what the cache cannot keep is refused."""

from __future__ import annotations

import pytest
import torch

from rlhf_lit.models import load_causal_lm, load_reward_model
from rlhf_lit.models.freezing import freeze_lower_layers
from rlhf_lit.models.scoring import causal_lm_logits, token_scores
from rlhf_lit.models.trunk_cache import TrunkCaches
from rlhf_lit.tokenizer import load_tokenizer

# stories260K: 5 blocks; the top 2 train, so blocks 0-2 and the embeddings are the kept trunk.
FROZEN = 3


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Three rows: full, right padded, left padded (pad id 0)."""
    ids = torch.tensor([[1, 40, 41, 42, 43, 44, 45], [1, 50, 51, 52, 0, 0, 0], [0, 0, 1, 60, 61, 62, 63]])
    mask = (ids != 0).long()
    return ids, mask


@pytest.fixture
def policy(stories_path):
    tok = load_tokenizer(stories_path)
    return freeze_lower_layers(load_causal_lm(stories_path, tok), 5 - FROZEN)


def test_a_cached_pass_gives_the_plain_logits_at_every_real_token(policy):
    ids, mask = _batch()
    with torch.no_grad():
        plain = causal_lm_logits(policy, ids, mask)
        caches = TrunkCaches()
        caches.attach(policy, FROZEN)
        first = causal_lm_logits(policy, ids, mask)  # every row computed alone, then read
        second = causal_lm_logits(policy, ids, mask)  # every row read
    real = mask.bool()
    # A row computed alone and in its padded batch: float32 rounding of another summation order only.
    torch.testing.assert_close(first[real], plain[real], rtol=1e-5, atol=1e-5)
    assert torch.equal(first, second)
    stats = caches.statistics()
    # the probe's 2 rows at attach are kept apart; here 3 rows computed once, then read once
    assert stats["misses"] == 2 + 3 and stats["hits"] == 3
    assert stats["bytes"] == 4 * (7 + 4 + 5) * policy.config.hidden_size


def test_a_kept_row_does_not_depend_on_its_batch(policy):
    ids, mask = _batch()
    caches = TrunkCaches()
    caches.attach(policy, FROZEN)
    (store,) = caches.stores.values()
    with torch.no_grad():
        causal_lm_logits(policy, ids, mask)
        in_batch = dict(store)
        caches.clear()
        causal_lm_logits(policy, ids[1:2, :4], mask[1:2, :4])  # the right-padded row, alone and unpadded
    ((key, alone),) = store.items()
    assert alone.shape == (4, policy.config.hidden_size)
    assert torch.equal(in_batch[key], alone)  # bit for bit: what a resumed run reads is what the first run read


def test_gradients_reach_the_trainable_top_and_match_the_plain_pass(policy):
    ids, mask = _batch()
    top = policy.model.layers[4].mlp.down_proj.weight

    def grad() -> torch.Tensor:
        policy.zero_grad()
        logits = causal_lm_logits(policy, ids, mask)
        (logits.log_softmax(-1)[mask.bool()][:, 5]).sum().backward()
        return top.grad.clone()

    plain = grad()
    caches = TrunkCaches()
    caches.attach(policy, FROZEN)
    cached = grad()
    torch.testing.assert_close(cached, plain, rtol=1e-4, atol=1e-6)
    assert all(p.grad is None for p in policy.model.layers[FROZEN - 1].parameters())


def test_models_of_one_trunk_share_a_store_and_a_changed_weight_does_not(stories_path, policy):
    tok = load_tokenizer(stories_path)
    reward = freeze_lower_layers(load_reward_model(stories_path, tok), 5 - FROZEN)
    reference = load_causal_lm(stories_path, tok).requires_grad_(False)
    caches = TrunkCaches()
    for model in (policy, reward, reference):
        caches.attach(model, FROZEN)
    assert len(caches.stores) == 1
    ids, mask = _batch()
    with torch.no_grad():
        causal_lm_logits(reference, ids, mask)  # computes the 3 rows
        before = caches.statistics()
        scores = token_scores(reward, ids, mask)  # reads them
    assert caches.statistics()["hits"] - before["hits"] == 3
    assert caches.statistics()["misses"] == before["misses"]
    caches.remove()
    with torch.no_grad():
        torch.testing.assert_close(scores[mask.bool()], token_scores(reward, ids, mask)[mask.bool()])
    other = load_causal_lm(stories_path, tok).requires_grad_(False)
    with torch.no_grad():
        other.model.layers[1].mlp.up_proj.weight[0, 0] += 1e-3
    caches.attach(policy, FROZEN)
    caches.attach(other, FROZEN)
    assert len(caches.stores) == 2
    # a setting outside the tensors (a frozen norm's eps) changes the probe row's output: a store of its own
    eps = load_causal_lm(stories_path, tok).requires_grad_(False)
    eps.model.layers[0].input_layernorm.variance_epsilon = 1e-2
    caches.attach(eps, FROZEN)
    assert len(caches.stores) == 3


def test_generation_and_unrecognised_calls_run_the_blocks_as_before(policy, stories_path):
    prompt = torch.tensor([[1, 40, 41]])
    plain = policy.generate(prompt, max_new_tokens=6, do_sample=False)
    caches = TrunkCaches()
    caches.attach(policy, FROZEN)
    assert torch.equal(policy.generate(prompt, max_new_tokens=6, do_sample=False), plain)
    with torch.no_grad():
        out = policy(input_ids=prompt).logits  # no mask, no positions: not a cached pass
    caches.remove()
    with torch.no_grad():
        assert torch.equal(out, policy(input_ids=prompt).logits)
    assert "forward" not in policy.model.layers[0].__dict__  # the blocks' own forward back


def test_what_the_cache_cannot_keep_is_refused(stories_path, policy):
    tok = load_tokenizer(stories_path)
    caches = TrunkCaches()
    with pytest.raises(ValueError, match="must be frozen"):
        caches.attach(load_causal_lm(stories_path, tok), FROZEN)  # nothing frozen
    with pytest.raises(ValueError, match="3 frozen blocks of 5|5 frozen blocks of 5"):
        caches.attach(policy, 5)
    caches.attach(policy, FROZEN)
    with pytest.raises(ValueError, match="already attached to a trunk cache"):
        TrunkCaches().attach(policy, FROZEN)
    dropping = freeze_lower_layers(load_causal_lm(stories_path, tok), 2)
    dropping.model.layers[0].mlp.add_module("drop", torch.nn.Dropout(0.1))
    with pytest.raises(ValueError, match="applies dropout below its trainable blocks"):
        caches.attach(dropping, FROZEN)


@pytest.mark.parametrize("kind", ["gpt2", "bloom", "opt"])
def test_other_architectures_pass_the_probe_and_match(kind):
    """Learned positions (GPT-2, OPT), ALiBi from the mask (BLOOM), tuple-returning blocks: the same outputs."""
    from transformers import BloomConfig, BloomForCausalLM, GPT2Config, GPT2LMHeadModel, OPTConfig, OPTForCausalLM

    torch.manual_seed(0)
    model = {
        "gpt2": lambda: GPT2LMHeadModel(
            GPT2Config(n_layer=4, n_embd=32, n_head=2, vocab_size=100, **_no_dropout("gpt2"))
        ),
        "bloom": lambda: BloomForCausalLM(BloomConfig(n_layer=4, hidden_size=32, n_head=2, vocab_size=100)),
        "opt": lambda: OPTForCausalLM(
            OPTConfig(
                num_hidden_layers=4,
                hidden_size=32,
                num_attention_heads=2,
                ffn_dim=64,
                vocab_size=100,
                word_embed_proj_dim=32,
                dropout=0.0,
                attention_dropout=0.0,
            )
        ),
    }[kind]().eval()
    freeze_lower_layers(model, 2)
    ids, mask = _batch()
    with torch.no_grad():
        plain = causal_lm_logits(model, ids, mask)
        TrunkCaches().attach(model, 2)
        cached = causal_lm_logits(model, ids, mask)
    torch.testing.assert_close(cached[mask.bool()], plain[mask.bool()], rtol=1e-5, atol=1e-5)


def _no_dropout(kind: str) -> dict:
    return {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0} if kind == "gpt2" else {}
