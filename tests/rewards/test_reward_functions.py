"""Reward functions: loading by spec, checked return values, built-in shaping by hand."""

from __future__ import annotations

import functools
import pickle
import re
import subprocess
import sys

import pytest
import torch
from suite_env import subprocess_env
from torch.testing import assert_close

from rlhf_lit.rewards import (
    RewardBatch,
    call_reward_function,
    length_penalty,
    length_target,
    load_reward_function,
    regex_format,
    unfinished_penalty,
)

torch.set_num_threads(1)

# Three responses: token lengths 4 (ended), 7 (cut at the limit), 2 (ended).
BATCH = RewardBatch(
    prompts=["Q1", "Q2", "Q3"],
    responses=["Answer: 42", "no answer here", "answer: 7\n"],
    response_ids=[[5, 6, 7, 2], [5, 6, 7, 8, 9, 10, 11], [5, 2]],
    ended=[True, False, True],
    extras={"ground_truth": ["42", "3", "7"]},
)


# --- built-in shaping, by hand -----------------------------------------------------------------


def test_length_penalty():
    # max_tokens 4, 0.5 per token beyond: 4 -> 0 ; 7 -> -0.5 * 3 = -1.5 ; 2 -> 0
    assert length_penalty(BATCH, max_tokens=4, per_token=0.5) == [0.0, -1.5, 0.0]


def test_length_target():
    # target 4, 0.25 per token of distance: |4-4| = 0 -> 0 ; |7-4| = 3 -> -0.75 ; |2-4| = 2 -> -0.5
    assert length_target(BATCH, target=4, per_token=0.25) == [0.0, -0.75, -0.5]


def test_unfinished_penalty_is_added_to_cut_responses_only():
    # BATCH: the second response was cut at the limit; the others ended with EOS.
    assert unfinished_penalty(BATCH, penalty=0.2) == [0.0, -0.2, 0.0]
    assert unfinished_penalty(BATCH, penalty=0) == [0.0, 0.0, 0.0]


def test_regex_format_search_fullmatch_and_inline_flags():
    # "Answer: \d+" found in row 0 only (row 2 is lower case)
    assert regex_format(BATCH, pattern=r"Answer: \d+") == [1.0, 0.0, 0.0]
    # (?i): row 2 matches too; unmatched = -1 is the penalty form
    assert regex_format(BATCH, pattern=r"(?i)answer: \d+", unmatched=-1.0) == [1.0, -1.0, 1.0]
    # whole_response: row 2's trailing newline is not covered by the pattern
    assert regex_format(BATCH, pattern=r"(?i)answer: \d+", whole_response=True) == [1.0, 0.0, 0.0]


@pytest.mark.parametrize(
    "fn, kwargs, message",
    [
        (length_penalty, {"max_tokens": -1}, "max_tokens must be an int >= 0"),
        (length_penalty, {"max_tokens": 4.5}, "max_tokens must be an int >= 0"),
        (length_penalty, {"max_tokens": 4, "per_token": -0.1}, "per_token must be a finite number >= 0"),
        (length_target, {"target": True}, "target must be an int >= 0"),
        (length_target, {"target": 4, "per_token": float("inf")}, "per_token must be a finite number >= 0"),
        (unfinished_penalty, {"penalty": -0.2}, "penalty must be a finite number >= 0"),
        (unfinished_penalty, {"penalty": float("nan")}, "penalty must be a finite number >= 0"),
        (unfinished_penalty, {"penalty": True}, "penalty must be a finite number >= 0"),
        (regex_format, {"pattern": "(unclosed"}, "is not a valid regular expression"),
        (regex_format, {"pattern": "x", "matched": float("nan")}, "matched must be a finite number"),
    ],
)
def test_shaping_parameters_are_checked(fn, kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        fn(BATCH, **kwargs)


def test_shaping_by_spec_and_by_partial_agree():
    by_spec = load_reward_function("rlhf_lit.rewards.shaping:length_target", {"target": 4, "per_token": 0.25})
    by_partial = functools.partial(length_target, target=4, per_token=0.25)
    assert_close(by_spec(BATCH)["length_target"], torch.tensor([0.0, -0.75, -0.5]))
    assert_close(call_reward_function(by_partial, BATCH, "length")["length"], torch.tensor([0.0, -0.75, -0.5]))


# --- call_reward_function: accepted forms ------------------------------------------------------


def _const(value):
    return lambda batch: value


@pytest.mark.parametrize(
    "value",
    [
        [1, 2.5, -3],
        (1, 2.5, -3),
        torch.tensor([1.0, 2.5, -3.0], dtype=torch.float64, requires_grad=True),
        torch.tensor([1, 2, -3]),
        [torch.tensor(1.0), 2.5, -3],
    ],
    ids=["list", "tuple", "float64-tensor", "int-tensor", "0-dim-tensor-elements"],
)
def test_plain_return_forms(value):
    out = call_reward_function(_const(value), BATCH, "rule")
    assert list(out) == ["rule"]
    scores = out["rule"]
    assert scores.dtype == torch.float32 and scores.device.type == "cpu" and not scores.requires_grad
    integer_tensor = isinstance(value, torch.Tensor) and not value.is_floating_point()
    assert_close(scores, torch.tensor([1.0, 2.0, -3.0]) if integer_tensor else torch.tensor([1.0, 2.5, -3.0]))


def test_bools_count_as_zero_and_one():
    out = call_reward_function(_const([True, False, True]), BATCH, "ok")
    assert_close(out["ok"], torch.tensor([1.0, 0.0, 1.0]))


def test_dict_return_gives_named_components():
    def answer_and_format(batch):
        correct = [r.endswith(t) for r, t in zip(batch.responses, batch.extras["ground_truth"])]
        return {"correct": correct, "format": torch.tensor([0.5, 0.0, 0.5])}

    out = call_reward_function(answer_and_format, BATCH, "math")
    assert sorted(out) == ["math/correct", "math/format"]
    # "Answer: 42" ends with "42" ; "no answer here" does not end with "3" ; "answer: 7\n" not with "7"
    assert_close(out["math/correct"], torch.tensor([1.0, 0.0, 0.0]))
    assert_close(out["math/format"], torch.tensor([0.5, 0.0, 0.5]))


# --- call_reward_function: every bad return is refused, naming the function ------------------


@pytest.mark.parametrize(
    "value, message",
    [
        ([1.0, 2.0], "returned 2 values for 3 responses"),
        ([1.0, 2.0, 3.0, 4.0], "returned 4 values for 3 responses"),
        ([1.0, float("nan"), 3.0], "non-finite value nan at index 1"),
        ([1.0, 2.0, float("-inf")], "non-finite value -inf at index 2"),
        ([1e39, 0.0, 0.0], "non-finite value inf at index 0"),  # beyond float32
        ([1.0, None, 3.0], "returned None at index 1; expected a real number (skipping"),
        ([1.0, "2", 3.0], "returned str at index 1"),
        ([1.0, [2.0], 3.0], "returned list at index 1"),
        ([1.0, 2j, 3.0], "returned complex at index 1"),
        ("1.0", "returned str; expected a list of floats"),
        (None, "returned None; expected a list of floats"),
        (1.0, "returned float; expected a list of floats"),
        (torch.ones(3, 1), r"returned a tensor of shape (3, 1); expected (3,)"),
        (torch.ones(3, dtype=torch.complex64), "returned a tensor of dtype torch.complex64"),
        (torch.tensor([1.0, float("inf"), 0.0]), "non-finite value inf at index 1"),
        ({}, "returned an empty dict"),
        ({1: [1.0, 2.0, 3.0]}, "returned a dict key 1; component names must be non-empty strings"),
        ({"a": [1.0, 2.0, 3.0], "b": [1.0]}, "(component 'b') returned 1 values for 3 responses"),
        ({"a": [1.0, float("nan"), 3.0]}, "(component 'a') returned a non-finite value nan at index 1"),
    ],
)
def test_bad_return_values_are_refused_naming_the_function(value, message):
    with pytest.raises(ValueError, match=re.escape("reward function 'my_rule'")) as err:
        call_reward_function(_const(value), BATCH, "my_rule")
    assert message in str(err.value)


def test_exception_inside_the_function_propagates_with_a_note():
    def broken(batch):
        raise KeyError("ground_truth")

    with pytest.raises(KeyError) as err:
        call_reward_function(broken, BATCH, "broken_rule")
    assert "raised inside reward function 'broken_rule'" in err.value.__notes__


def test_reward_batch_lengths_must_agree():
    with pytest.raises(ValueError, match=r"one entry per response.*'ended': 2"):
        RewardBatch(["a", "b", "c"], ["x", "y", "z"], [[1], [2], [3]], [True, False])
    with pytest.raises(ValueError, match=r"extras\['ground_truth'\]"):
        RewardBatch(["a"], ["x"], [[1]], [True], {"ground_truth": ["1", "2"]})
    assert len(BATCH) == 3


# --- load_reward_function ---------------------------------------------------------------------


@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    """A user's reward module on sys.path."""
    (tmp_path / "my_rewards.py").write_text(
        "def mentions(batch, *, word, bonus=1.0):\n"
        "    return [bonus if word in r else 0.0 for r in batch.responses]\n"
        "def too_few(batch):\n"
        "    return [1.0]\n"
        "class Rules:\n"
        "    @staticmethod\n"
        "    def ended(batch):\n"
        "        return {'eos': batch.ended}\n"
        "LIMIT = 3\n"
    )
    (tmp_path / "broken_rewards.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_rewards"
    for name in ("my_rewards", "broken_rewards"):
        sys.modules.pop(name, None)


def test_load_user_function_with_parameters(reward_module):
    fn = load_reward_function("my_rewards:mentions", {"word": "answer", "bonus": 2.0})
    # "no answer here" and "answer: 7\n" contain "answer"; "Answer: 42" does not (case)
    assert fn.name == "mentions"
    assert_close(fn(BATCH)["mentions"], torch.tensor([0.0, 2.0, 2.0]))


def test_load_nested_attribute_and_custom_name(reward_module):
    fn = load_reward_function("my_rewards:Rules.ended", name="eos_rule")
    assert_close(fn(BATCH)["eos_rule/eos"], torch.tensor([1.0, 0.0, 1.0]))


@pytest.mark.parametrize(
    "spec, message",
    [
        ("my_rewards.mentions", "is not of the form 'module:function'"),
        (":mentions", "is not of the form 'module:function'"),
        ("my_rewards:", "is not of the form 'module:function'"),
        ("no_such_reward_module_xyz:score", "no module named 'no_such_reward_module_xyz'"),
        ("my_rewards:nope", "'my_rewards' has no attribute 'nope'"),
        ("my_rewards:LIMIT", "'LIMIT' is not callable (type int)"),
    ],
)
def test_bad_spec_names_the_spec(reward_module, spec, message):
    with pytest.raises(ValueError, match=re.escape(repr(spec))) as err:
        load_reward_function(spec)
    assert message in str(err.value)


def test_missing_dependency_inside_the_module_is_not_blamed_on_the_spec(reward_module):
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_xyz"):
        load_reward_function("broken_rewards:score")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "missing a required argument: 'word'"),
        ({"word": "x", "bonnus": 1.0}, "unexpected keyword argument 'bonnus'"),
    ],
)
def test_parameters_are_checked_at_load_time(reward_module, kwargs, message):
    with pytest.raises(ValueError, match=re.escape("reward function 'my_rewards:mentions'")) as err:
        load_reward_function("my_rewards:mentions", kwargs)
    assert message in str(err.value)


def test_empty_name_is_refused(reward_module):
    with pytest.raises(ValueError, match="name must be a non-empty string"):
        load_reward_function("my_rewards:too_few", name="")


def test_loaded_function_output_is_checked_naming_it(reward_module):
    with pytest.raises(ValueError, match=re.escape("reward function 'too_few' returned 1 values for 3 responses")):
        load_reward_function("my_rewards:too_few")(BATCH)


def test_loaded_function_pickles_by_spec(reward_module):
    # ddp_spawn pickles what the module holds.
    fn = pickle.loads(pickle.dumps(load_reward_function("my_rewards:mentions", {"word": "here"}, name="here")))
    assert (fn.spec, fn.kwargs, fn.name) == ("my_rewards:mentions", {"word": "here"}, "here")
    assert_close(fn(BATCH)["here"], torch.tensor([0.0, 1.0, 0.0]))


CODE = """
import sys
import rlhf_lit.rewards
heavy = sorted(m for m in sys.modules
               if m.split('.')[0] in ('lightning', 'pytorch_lightning', 'lightning_fabric', 'transformers'))
ours = sorted(m for m in sys.modules if m.startswith('rlhf_lit.') and not m.startswith(('rlhf_lit.rewards', 'rlhf_lit.callable_specs')))
print(heavy, ours)
"""


def test_rewards_imports_torch_and_stdlib_only():
    out = subprocess.run(
        [sys.executable, "-c", CODE], capture_output=True, text=True, check=True, timeout=120, env=subprocess_env()
    )
    assert out.stdout.strip() == "[] []", out.stdout + out.stderr
