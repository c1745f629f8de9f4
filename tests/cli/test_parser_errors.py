"""The pieces that turn a jsonargparse error into one line, on reports copied from jsonargparse 4.53.

Fast (no CLI run): reading the nested report (`rlhf_lit.cli.parser_errors`), the nearest valid key
(`option_names`), finding where a key was given (`option_sources`) and the two jsonargparse
adjustments (`jsonargparse_fixes`). The same behaviour through `rlhf-lit` is in test_option_errors.py.
"""

from __future__ import annotations

import textwrap

import pytest
import yaml

from rlhf_lit.cli.jsonargparse_fixes import option_text, yaml_error_text
from rlhf_lit.cli.option_names import known_subclasses, nearest_option
from rlhf_lit.cli.option_sources import Where, find_in_yaml, given_settings, locate
from rlhf_lit.cli.parser_errors import ParserProblem, describe, find_problem, read_report

# ------------------------------------------------------------------------------------ jsonargparse's reports

TYPO_ON_THE_COMMAND_LINE = """Parser key "model":
  Does not validate against any of the Union subtypes
  Subtypes: [<class 'lightning.pytorch.core.module.LightningModule'>, <class 'NoneType'>]
  Errors:
    - Problem with given class_path 'rlhf_lit.stages.PPOModule':
        unrecognized arguments: --ppo.epochz=3
    - Expected a <class 'NoneType'>
  Given value type: <class 'jsonargparse._util.NestedArg'>
  Given value: NestedArg(key='ppo.epochz', val='3')"""

TYPO_IN_A_LIST_ELEMENT = """Parser key "trainer.callbacks":
  Does not validate against any of the Union subtypes
  Subtypes: [list[lightning.pytorch.callbacks.callback.Callback], <class 'lightning.pytorch.callbacks.callback.Callback'>, <class 'NoneType'>]
  Errors:
    - Problem with given class_path 'rlhf_lit.callbacks.OnlineGeneration':
        Option 'every_n_rolouts' is not accepted
    - Not a valid subclass of Callback
      Subclass types expect one of:
      - a class path (str)
      - a dict with class_path entry
    - Expected a <class 'NoneType'>
  Given value type: <class 'list'>
  Given value: [{'class_path': 'rlhf_lit.callbacks.OnlineGeneration'}]"""

NO_SUCH_CLASS = """Parser key "model":
  Does not validate against any of the Union subtypes
  Subtypes: [<class 'lightning.pytorch.core.module.LightningModule'>, <class 'NoneType'>]
  Errors:
    - Problem with given class_path 'rlhf_lit.stages.PPOModul':
        module 'rlhf_lit.stages' has no attribute 'PPOModul'
    - Expected a <class 'NoneType'>
  Given value type: <class 'dict'>
  Given value: {'class_path': 'rlhf_lit.stages.PPOModul'}"""

NO_SUCH_SHORT_NAME = """Parser key "model":

  - Expected a path but PPOModul either not accessible or invalid
  - Does not validate against any of the Union subtypes
  Subtypes: [<class 'lightning.pytorch.core.module.LightningModule'>, <class 'NoneType'>]
  Errors:
    - Expected a dot import path string: PPOModul
    - Expected a <class 'NoneType'>
  Given value type: <class 'str'>
  Given value: PPOModul"""

WRONG_TYPE_IN_A_LIST = """Parser key "model":
  Does not validate against any of the Union subtypes
  Subtypes: [<class 'lightning.pytorch.core.module.LightningModule'>, <class 'NoneType'>]
  Errors:
    - Problem with given class_path 'rlhf_lit.stages.PPOModule':
        Parser key "reward.sources":
          Problem with given class_path 'rlhf_lit.stages.ppo.RewardSource':
            Parser key "weight":
              Expected a <class 'float'>. Got value: abc
    - Expected a <class 'NoneType'>
  Given value type: <class 'dict'>"""

NOT_AN_ELEMENT = """Parser key "model":
  Does not validate against any of the Union subtypes
  Subtypes: [<class 'lightning.pytorch.core.module.LightningModule'>, <class 'NoneType'>]
  Errors:
    - Problem with given class_path 'rlhf_lit.stages.PPOModule':
        Parser key "reward.sources":

          - Expected a path but [3] either not accessible or invalid
          - Not a valid subclass of RewardSource. Got value: 3
          Subclass types expect one of:
          - a class path (str)
    - Expected a <class 'NoneType'>"""


def test_the_report_is_read_as_a_tree_by_indentation():
    (root,) = read_report(TYPO_ON_THE_COMMAND_LINE)
    assert root.text == 'Parser key "model":'
    assert [c.text.split(":")[0] for c in root.children] == [
        "Does not validate against any of the Union subtypes",
        "Subtypes",
        "Errors",
        "Given value type",
        "Given value",
    ]
    errors = root.children[2].children
    assert [e.text for e in errors] == [
        "Problem with given class_path 'rlhf_lit.stages.PPOModule':",
        "Expected a <class 'NoneType'>",
    ]
    assert [c.text for c in errors[0].children] == ["unrecognized arguments: --ppo.epochz=3"]


@pytest.mark.parametrize(
    ("report", "expected"),
    [
        (
            TYPO_ON_THE_COMMAND_LINE,
            ParserProblem(
                "unknown_key",
                ("model", "init_args", "ppo", "epochz"),
                "unrecognized arguments: --ppo.epochz=3",
                ("model", "init_args"),
                "rlhf_lit.stages.PPOModule",
            ),
        ),
        (
            TYPO_IN_A_LIST_ELEMENT,
            ParserProblem(
                "unknown_key",
                ("trainer", "callbacks", "init_args", "every_n_rolouts"),
                "Option 'every_n_rolouts' is not accepted",
                ("trainer", "callbacks", "init_args"),
                "rlhf_lit.callbacks.OnlineGeneration",
            ),
        ),
        # a top-level report: no Union around it
        (
            "Group 'trainer' does not accept option 'max_stepz'",
            ParserProblem(
                "unknown_key", ("trainer", "max_stepz"), "Group 'trainer' does not accept option 'max_stepz'"
            ),
        ),
        (
            "unrecognized arguments: --trainer.max_stepz 3 --x 1",
            ParserProblem(
                "unknown_key", ("trainer", "max_stepz"), "unrecognized arguments: --trainer.max_stepz 3 --x 1"
            ),
        ),
        (
            NO_SUCH_CLASS,
            ParserProblem(
                "unknown_class",
                ("model",),
                "module 'rlhf_lit.stages' has no attribute 'PPOModul'",
                value="rlhf_lit.stages.PPOModul",
                expected="lightning.pytorch.core.module.LightningModule",
            ),
        ),
        (
            NO_SUCH_SHORT_NAME,
            ParserProblem(
                "unknown_class",
                ("model",),
                "Expected a dot import path string: PPOModul",
                value="PPOModul",
                expected="lightning.pytorch.core.module.LightningModule",
            ),
        ),
        # RewardSource is a dataclass: its keys sit directly under the list element, no init_args
        (
            WRONG_TYPE_IN_A_LIST,
            ParserProblem(
                "bad_value",
                ("model", "init_args", "reward", "sources", "weight"),
                "Expected a <class 'float'>. Got value: abc",
                ("model", "init_args", "reward", "sources"),
                "rlhf_lit.stages.ppo.RewardSource",
                value="abc",
                expected="<class 'float'>",
            ),
        ),
        (
            NOT_AN_ELEMENT,
            ParserProblem(
                "bad_value",
                ("model", "init_args", "reward", "sources"),
                "Not a valid subclass of RewardSource. Got value: 3",
                ("model", "init_args"),
                "rlhf_lit.stages.PPOModule",
                value="3",
                expected="RewardSource",
            ),
        ),
        (
            "Configuration check failed :: something new",
            ParserProblem("other", (), "Configuration check failed :: something new"),
        ),
    ],
    ids=[
        "cli-typo",
        "list-element-typo",
        "group",
        "unrecognized",
        "no-class",
        "no-short-name",
        "list-type",
        "not-element",
        "unknown",
    ],
)
def test_the_telling_alternative_is_found(report, expected):
    assert find_problem(report) == expected


# ------------------------------------------------------------------------------------ the nearest valid key

PPO_KEYS = [
    "sft_model",
    "critic",
    "ppo.epochs",
    "ppo.minibatch_size",
    "ppo.lam",
    "reward.sources",
    "reward.clip",
    "max_rollouts",
    "lora.r",
    "lora.alpha",
]


@pytest.mark.parametrize(
    ("wrong", "nearest"),
    [
        ("ppo.epochz", "ppo.epochs"),
        ("ppp.epochs", "ppo.epochs"),  # the group is the typo
        ("ppp.epochz", "ppo.epochs"),  # both
        ("max_rolouts", "max_rollouts"),
        ("epochs", "ppo.epochs"),  # written at the wrong level
        ("lam", "ppo.lam"),  # the same, too short for a close match of the whole key
        ("lora.rr", "lora.r"),
        ("zzzz", None),
        ("ppo.zzzz", None),
    ],
)
def test_nearest_option(wrong, nearest):
    assert nearest_option(tuple(wrong.split(".")), PPO_KEYS) == nearest


def test_class_choices_are_the_exported_concrete_subclasses_of_the_package_named():
    stages = [
        "rlhf_lit.stages.BoNBoNModule",
        "rlhf_lit.stages.DPOModule",
        "rlhf_lit.stages.PPOModule",
        "rlhf_lit.stages.RewardModelModule",
        "rlhf_lit.stages.SFTModule",
    ]
    assert known_subclasses("lightning.pytorch.core.module.LightningModule", "PPOModul") == stages  # no base classes
    callbacks = known_subclasses("lightning.pytorch.callbacks.callback.Callback", "rlhf_lit.callbacks.OnlineGen")
    assert callbacks == [
        "rlhf_lit.callbacks.Checkpoint",
        "rlhf_lit.callbacks.OnlineGeneration",
        "rlhf_lit.callbacks.OverOptimisationGuard",
        "rlhf_lit.callbacks.Preemption",
        "rlhf_lit.callbacks.RolloutCheckpoint",
        "rlhf_lit.callbacks.RunProgressBar",
    ]


# ------------------------------------------------------------------------------------ where a key was given

CONFIG = textwrap.dedent("""\
    trainer:
      callbacks:
        - class_path: rlhf_lit.callbacks.Checkpoint
        - class_path: rlhf_lit.callbacks.OnlineGeneration
          init_args: {every_n_rolouts: 5}
    model:
      init_args:
        reward:
          sources: [{name: rm, weight: 1}, {name: len, weight: abc}]
    """)


def test_a_key_is_found_on_its_line_with_list_indexes():
    assert find_in_yaml(CONFIG, ["trainer", "callbacks", "init_args", "every_n_rolouts"]) == (
        5,
        "trainer.callbacks[1].init_args.every_n_rolouts",
    )
    assert find_in_yaml(CONFIG, ["model", "init_args", "reward", "sources", "weight"], "abc") == (
        9,
        "model.init_args.reward.sources[1].weight",
    )  # the element whose value is the bad one
    assert find_in_yaml(CONFIG, ["model", "init_args", "ppo", "epochs"]) is None
    assert find_in_yaml("model: [unclosed", ["model"]) is None


def test_the_last_setting_of_a_key_is_the_one_located(tmp_path):
    (tmp_path / "a.yaml").write_text("model:\n  init_args:\n    ppo: {epochz: 3}\n")
    (tmp_path / "b.yaml").write_text("trainer: {}\nmodel:\n  init_args:\n    ppo:\n      epochz: 4\n")
    path = ("model", "init_args", "ppo", "epochz")
    assert given_settings(["fit", "--config", "a.yaml", "--x=1", "--y", "2", "--z"]) == [
        ("config", "a.yaml", None),
        ("option", "x", "1"),
        ("option", "y", "2"),
        ("option", "z", None),
    ]
    assert locate(path, ["fit", "--config", "a.yaml", "--config", "b.yaml"], cwd=tmp_path) == Where(
        file="b.yaml", line=5, key="model.init_args.ppo.epochz"
    )
    assert locate(path, ["fit", "--config", "b.yaml", "--config", "a.yaml"], cwd=tmp_path).file == "a.yaml"
    assert locate(path, ["fit", "--config", "a.yaml", "--model.ppo.epochz", "5"], cwd=tmp_path) == Where(
        option="model.ppo.epochz"
    )  # the short form (no init_args) names the same key
    assert (
        locate(path, ["fit", "--model.init_args.ppo.epochz", "5", "--config", "a.yaml"], cwd=tmp_path).file == "a.yaml"
    )
    assert locate(path, ["fit", "--model.init_args.ppo", "{epochs: 2, epochz: 3}"], cwd=tmp_path) == Where(
        option="model.init_args.ppo", key="epochz"
    )  # a mapping given to the option above the key
    assert locate(path, ["fit", "--model", "PPOModule"], cwd=tmp_path) is None


# ------------------------------------------------------------------------------------ the one line


def test_describe_says_where_what_and_the_nearest_choice():
    problem = find_problem(TYPO_ON_THE_COMMAND_LINE)
    keys = {"rlhf_lit.stages.PPOModule": PPO_KEYS}.get
    assert describe(problem, None, keys) == (
        "unknown option --model.init_args.ppo.epochz; did you mean --model.init_args.ppo.epochs?"
    )
    in_file = Where(file="x.yaml", line=4, key="model.init_args.ppo.epochz")
    assert describe(problem, in_file, keys) == (
        "x.yaml, line 4: unknown key model.init_args.ppo.epochz; did you mean model.init_args.ppo.epochs?"
    )
    in_list = find_problem(TYPO_IN_A_LIST_ELEMENT)
    where = Where(file="x.yaml", line=5, key="trainer.callbacks[1].init_args.every_n_rolouts")
    assert describe(in_list, where, lambda c: ["every_n_rollouts", "prompts"]) == (
        "x.yaml, line 5: unknown key trainer.callbacks[1].init_args.every_n_rolouts; "
        "did you mean trainer.callbacks[1].init_args.every_n_rollouts?"
    )
    bad = find_problem(WRONG_TYPE_IN_A_LIST)
    assert describe(bad, Where(option="model.init_args.reward.sources", key="[1].weight")) == (
        "option --model.init_args.reward.sources: [1].weight: expected float, got abc"
    )
    literal = ParserProblem(
        "bad_value",
        ("model", "init_args", "critic"),
        "",
        value="sepparate",
        expected="typing.Literal['separate', 'shared_trunk']",
    )
    assert describe(literal) == (
        "option --model.init_args.critic: expected one of 'separate', 'shared_trunk', got sepparate; "
        "did you mean 'separate'?"
    )
    no_class = find_problem(NO_SUCH_CLASS)
    assert describe(no_class, Where(file="x.yaml", line=2, key="model.class_path")) == (
        "x.yaml, line 2: model.class_path: no class rlhf_lit.stages.PPOModul; did you mean rlhf_lit.stages.PPOModule? "
        "(choices: rlhf_lit.stages.BoNBoNModule, rlhf_lit.stages.DPOModule, rlhf_lit.stages.PPOModule, "
        "rlhf_lit.stages.RewardModelModule, rlhf_lit.stages.SFTModule)"
    )


# ------------------------------------------------------------------------------------ jsonargparse adjustments


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "null"),
        (True, "true"),
        (3, "3"),
        (1e-05, "1.0e-05"),
        (float("inf"), ".inf"),
        ("a b", "a b"),
        ([1, None], "[1, null]"),
        ({"a": None, "b": "x: y"}, "{a: null, b: 'x: y'}"),
        (["café"], "[café]"),
    ],
)
def test_option_text_is_yaml_that_reads_back_as_the_value(value, text):
    from jsonargparse._loaders_dumpers import get_yaml_default_loader

    assert option_text(value) == text
    assert yaml.load(text, Loader=get_yaml_default_loader()) == value  # jsonargparse's own YAML reading


def test_a_yaml_syntax_error_names_the_file_line_and_column():
    from jsonargparse._loaders_dumpers import get_yaml_default_loader

    with pytest.raises(yaml.YAMLError) as raised:  # jsonargparse's reading (libyaml's words where it is built)
        yaml.load("model:\n  init_args: [a, b\n", Loader=get_yaml_default_loader())
    problem = raised.value.problem  # libyaml: "did not find expected ',' or ']'"; pure Python words it otherwise
    assert yaml_error_text(raised.value, "configs/x.yaml") == (
        f"configs/x.yaml, line 3, column 1: {problem} (while parsing a flow sequence that starts at line 2, column 14)"
    )


def test_a_report_that_cannot_be_read_still_ends_in_its_first_line(monkeypatch, capsys):
    import rlhf_lit.cli as cli

    def unreadable(*args):
        raise IndexError("a report of a new shape")

    monkeypatch.setattr(cli, "condense_parser_error", unreadable)
    with pytest.raises(SystemExit) as done:
        cli.ConciseArgumentParser(prog="rlhf-lit fit").error("Something new:\n  with details")
    assert done.value.code == 2
    assert capsys.readouterr().err.splitlines()[0] == "rlhf-lit: error: Something new:"
