"""An evaluation whose reference is the policy itself (the chat demo's instruction model against itself): one
model loaded, its KL exactly 0 without a teacher-forced pass; another folder with the same weights is a
reference like any other."""

from __future__ import annotations

import shutil

import assets_paths
import pytest

import rlhf_lit.evaluation.samples as samples_module
from rlhf_lit.evaluation.policy_metrics import evaluate_policy
from rlhf_lit.models.generation import SamplingConfig

STORIES = str(assets_paths.STORIES260K)


def test_the_policy_against_itself_is_one_model_and_kl_zero(tmp_path, monkeypatch):
    models = samples_module.load_models(STORIES, reference=STORIES)
    assert models.reference is models.policy

    def no_pass(*args, **kwargs):
        raise AssertionError("a teacher-forced pass ran for the KL of a policy against itself")

    monkeypatch.setattr("rlhf_lit.models.teacher_forced.response_logprobs", no_pass)
    result = evaluate_policy(
        STORIES, ["Once upon a time", "The cat"], reference=STORIES, sampling=SamplingConfig(max_new_tokens=6)
    )
    assert [s["kl"] for s in result["samples"]] == [0.0, 0.0]
    assert result["metrics"]["kl_mean"] == 0.0


def test_a_copy_of_the_policy_is_a_reference_of_its_own(tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(STORIES, copy)
    models = samples_module.load_models(STORIES, reference=str(copy))
    assert models.reference is not models.policy
    result = evaluate_policy(
        STORIES, ["Once upon a time", "The cat"], reference=str(copy), sampling=SamplingConfig(max_new_tokens=6)
    )
    assert result["metrics"]["kl_mean"] == pytest.approx(0.0, abs=1e-5)  # the same weights, computed
