"""bench/chat_kl_tokens.py: a policy's KL split by position, by token and in entropy, by hand.

Two fake models over a three-token vocabulary (``a``, ``b``, the end of turn) whose next-token
distributions are the same at every position: the policy's (1/2, 1/4, 1/4), the reference's (1/4, 1/2,
1/4). A drawn ``a`` has log-ratio ln 2, ``b`` -ln 2, the end 0; the exact KL at every position is
1/2 ln 2 - 1/4 ln 2 = ln 2 / 4.
"""

from __future__ import annotations

import math
import sys
from types import SimpleNamespace

import pytest
import torch
from assets_paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from chat_kl_tokens import likelihood_correlations, pearson, position_bin, split_kl  # noqa: E402

END = 2
LN2 = math.log(2.0)


class CharTokenizer:
    """``a`` -> 0, ``b`` -> 1, ``<|im_end|>`` -> 2; ``p`` (a prompt character) -> 0 too."""

    ids = {"a": 0, "b": 1, "p": 0}

    def convert_tokens_to_ids(self, token: str) -> int:
        assert token == "<|im_end|>"
        return END

    def __call__(self, text: str, add_special_tokens: bool = False):
        return SimpleNamespace(input_ids=[self.ids[c] for c in text])

    def decode(self, ids: list[int]) -> str:
        return {0: "a", 1: "b", 2: "<|im_end|>"}[ids[0]]


class FixedModel:
    """A causal LM whose next-token distribution is ``probs`` at every position."""

    def __init__(self, probs: list[float]) -> None:
        self.logits = torch.log(torch.tensor(probs))

    def __call__(self, ids: torch.Tensor):
        return SimpleNamespace(logits=self.logits.expand(ids.shape[0], ids.shape[1], 3).clone())


POLICY, REFERENCE = FixedModel([0.5, 0.25, 0.25]), FixedModel([0.25, 0.5, 0.25])
SAMPLES = [
    {"prompt_text": "pp", "response": "aab", "ended": False, "kl": "0.0"},  # a, a, b: ln 2 + ln 2 - ln 2
    {"prompt_text": "p", "response": "b", "ended": True, "kl": "0.0"},  # b, end: -ln 2 + 0
]


def test_positions_fall_in_their_bins():
    assert [position_bin(t, False) for t in (0, 1, 4, 5, 19, 20, 47)] == [
        "first",
        "2-5",
        "2-5",
        "6-20",
        "6-20",
        "21+",
        "21+",
    ]
    assert position_bin(0, True) == position_bin(30, True) == "end of turn"


def test_the_kl_split_by_position_token_and_entropy_by_hand():
    r = split_kl(POLICY, REFERENCE, CharTokenizer(), SAMPLES, top=3)
    assert r["replies"] == 2
    assert r["kl_recomputed"] == pytest.approx((LN2 + (-LN2)) / 2)  # reply sums ln 2 and -ln 2
    first, second, end = r["bins"]["first"], r["bins"]["2-5"], r["bins"]["end of turn"]
    assert first["tokens"] == pytest.approx(1.0)  # one first token a reply
    assert first["sampled_kl"] == pytest.approx((LN2 - LN2) / 2)  # a then b
    assert second["tokens"] == pytest.approx(1.0) and second["sampled_kl"] == pytest.approx(0.0)  # a, b of reply 1
    assert end["tokens"] == pytest.approx(0.5) and end["sampled_kl"] == pytest.approx(0.0)
    assert first["exact_kl"] == pytest.approx(LN2 / 4)  # two first tokens, ln 2 / 4 each, over 2 replies
    assert second["exact_kl"] == pytest.approx(2 * LN2 / 4 / 2)
    assert end["exact_kl"] == pytest.approx(LN2 / 4 / 2)
    h_policy = -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25))
    h_reference = -(0.25 * math.log(0.25) + 0.5 * math.log(0.5) + 0.25 * math.log(0.25))
    assert first["entropy"] == pytest.approx(h_policy) and first["entropy_reference"] == pytest.approx(h_reference)
    raised, lowered = dict(r["raised"]), dict(r["lowered"])
    assert raised["a"] == pytest.approx(2 * LN2 / 2)  # drawn twice, over 2 replies
    assert lowered["b"] == pytest.approx(-2 * LN2 / 2)
    assert r["raised"][0][0] == "a" and r["lowered"][0][0] == "b"
    # The two distributions hold the same probabilities in another order: the same entropy, no sharpening.
    assert r["sharpening"]["temperature"] == pytest.approx(1.0) and r["sharpening"]["kl"] == pytest.approx(
        0.0, abs=1e-6
    )


def test_a_policy_that_is_the_reference_sharpened_costs_exactly_its_sharpening():
    # pi = softmax(log pi_ref / 0.7): the matched temperature is 0.7 and its KL the policy's whole exact KL.
    sharpened = torch.softmax(torch.log(torch.tensor([0.25, 0.5, 0.25])) / 0.7, -1)
    r = split_kl(FixedModel(sharpened.tolist()), REFERENCE, CharTokenizer(), SAMPLES, top=3)
    exact = sum(row["exact_kl"] for row in r["bins"].values())
    assert r["sharpening"]["temperature"] == pytest.approx(0.7, abs=1e-4)
    assert r["sharpening"]["kl"] == pytest.approx(exact, rel=1e-4)
    assert exact > 0.02  # a real sharpening, not a rounding


def test_pearson_by_hand():
    # x - mean = (-1, 0, 1), y - mean = (-7/3, -1/3, 8/3): sxy 5, sxx 2, syy 114 / 9
    assert pearson([1, 2, 3], [2, 4, 7]) == pytest.approx(5 / math.sqrt(2 * 114 / 9))
    assert pearson([1, 1, 1], [2, 4, 7]) == 0.0


def test_likelihood_correlations_read_each_request_apart():
    # Under the reference a is 1/4, b 1/2: reply "b" is likelier than "a". Request 0: the likelier reply has
    # the higher score (+1); request 1: the lower (-1); the judge the other way. Request 2 is not read.
    draw = {
        "prompt_texts": ["p", "p", "p"],
        "samples": [
            {"prompt_index": 0, "response": "a", "ended": False, "rm": 0.0, "judge": 1.0},
            {"prompt_index": 0, "response": "b", "ended": False, "rm": 1.0, "judge": 0.0},
            {"prompt_index": 1, "response": "a", "ended": False, "rm": 1.0, "judge": 1.0},
            {"prompt_index": 1, "response": "b", "ended": False, "rm": 0.0, "judge": 0.0},
            {"prompt_index": 2, "response": "a", "ended": False, "rm": 5.0, "judge": 5.0},
            {"prompt_index": 2, "response": "b", "ended": False, "rm": 9.0, "judge": 0.0},
        ],
    }
    c = likelihood_correlations(REFERENCE, CharTokenizer(), draw, requests=2)
    assert c["requests"] == 2 and c["replies_per_request"] == 2
    assert c["rm~mean_logp"]["mean"] == pytest.approx(0.0)  # +1 and -1
    assert c["rm~mean_logp"]["stderr"] == pytest.approx(math.sqrt(2) / math.sqrt(2))  # sd of (1, -1) over sqrt 2
    assert c["judge~mean_logp"]["mean"] == pytest.approx(-1.0)
    assert c["rm~judge"]["mean"] == pytest.approx(0.0)
