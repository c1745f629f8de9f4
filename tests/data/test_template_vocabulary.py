"""One vocabulary for "render strings with the chat template?" (#37): ``auto | always | never``,
with ``hh_render``'s older ``chat_template`` / ``raw`` as aliases (rlhf_lit/data/rendering.py).

Each alias must act exactly as its canonical value wherever the choice is made: the data modules
(``hh_render``), the callbacks (``chat_template``), the resume check; the commands'
``--chat-template`` is tested through the CLI in tests/cli/test_template_vocabulary_cli.py.
"""

from __future__ import annotations

import copy

import pytest
from data_assets import write_jsonl

from rlhf_lit.callbacks import OnlineGeneration
from rlhf_lit.callbacks.guard import HeldOut
from rlhf_lit.data import PreferenceDataModule, PromptDataModule, SFTDataModule
from rlhf_lit.data.rendering import TEMPLATE_ALIASES, TEMPLATE_CHOICES, resolve_template, template_choice
from rlhf_lit.stages.resume import ResumeMismatch, check_resume

CHOSEN = "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Help me?\n\nAssistant: Sure."
RECORD = {"chosen": CHOSEN, "rejected": CHOSEN[: -len("Sure.")] + "No."}
PAIRS = [("chat_template", "always"), ("raw", "never")]


@pytest.fixture
def hh_file(tmp_path):
    return write_jsonl(tmp_path / "hh.jsonl", [RECORD])


@pytest.fixture
def gpt2(gpt2_tok):
    tok = copy.deepcopy(gpt2_tok)
    tok.pad_token = tok.eos_token
    return tok


def test_the_vocabulary_is_auto_always_never_and_the_aliases_map_to_it():
    assert TEMPLATE_CHOICES == ("auto", "always", "never")
    assert dict(TEMPLATE_ALIASES) == dict(PAIRS)
    for value in TEMPLATE_CHOICES:
        assert template_choice(value, "hh_render") == value
    for alias, canonical in PAIRS:
        assert template_choice(alias, "hh_render") == canonical


@pytest.mark.parametrize("name", ["hh_render", "--chat-template", "OnlineGeneration chat_template"])
def test_a_bad_value_is_one_line_naming_the_option_and_the_canonical_choices(name):
    with pytest.raises(ValueError) as caught:
        template_choice("chat", name)
    assert str(caught.value) == f"{name} must be one of auto, always, never; got 'chat'"


@pytest.mark.parametrize(("alias", "canonical"), PAIRS)
def test_an_alias_resolves_as_its_canonical_value(alias, canonical, chat_tok, gpt2):
    for tok in (chat_tok, gpt2):
        for training in (None, True, False):
            try:
                want = resolve_template(canonical, tok, "hh_render", training=training).chat
            except ValueError:  # always without a template: the alias is refused too
                with pytest.raises(ValueError, match="has no chat template"):
                    resolve_template(alias, tok, "hh_render", training=training)
                continue
            assert resolve_template(alias, tok, "hh_render", training=training).chat == want


def batches(dm):
    dm.setup()
    return [{k: v.tolist() if hasattr(v, "tolist") else v for k, v in b.items()} for b in dm.train_dataloader()]


@pytest.mark.parametrize(("alias", "canonical"), PAIRS)
@pytest.mark.parametrize("module", [SFTDataModule, PreferenceDataModule, PromptDataModule])
def test_a_data_module_reads_hh_the_same_under_the_alias(module, alias, canonical, chat_tok, hh_file):
    by_alias = module(tokenizer=chat_tok, train_path=hh_file, format="hh_rlhf", hh_render=alias, batch_size=1)
    by_name = module(tokenizer=chat_tok, train_path=hh_file, format="hh_rlhf", hh_render=canonical, batch_size=1)
    assert batches(by_alias) == batches(by_name)
    assert by_alias.hparams.get("hh_render") == by_name.hparams.get("hh_render")  # the record is canonical
    assert by_alias.chat_rendered == by_name.chat_rendered


def test_the_data_modules_refuse_a_bad_hh_render_in_one_line(chat_tok, hh_file):
    for module in (SFTDataModule, PreferenceDataModule, PromptDataModule):
        with pytest.raises(ValueError, match=r"^hh_render must be one of auto, always, never; got 'yes'$"):
            module(tokenizer=chat_tok, train_path=hh_file, hh_render="yes")


def test_an_older_checkpoint_recording_chat_template_resumes_against_always():
    checkpoint = {"hyper_parameters": {}, "datamodule_hyper_parameters": {"hh_render": "chat_template"}}
    check_resume(checkpoint, {}, {"hh_render": "always"}, ())
    with pytest.raises(ResumeMismatch, match=r"data.hh_render: checkpoint 'always', now \(not set\)"):
        check_resume(checkpoint, {}, {}, ())  # read as raw strings now: still refused


@pytest.mark.parametrize(("alias", "canonical"), PAIRS)
def test_the_callbacks_take_the_aliases(alias, canonical, chat_tok):
    assert HeldOut(prompts=["Hi"], chat_template=alias).chat_template == canonical
    by_alias, by_name = OnlineGeneration(["Hi"], chat_template=alias), OnlineGeneration(["Hi"], chat_template=canonical)
    assert by_alias.rendered(chat_tok).ids == by_name.rendered(chat_tok).ids


def test_the_callbacks_refuse_a_bad_value_naming_the_option():
    with pytest.raises(
        ValueError, match=r"^OnlineGeneration chat_template must be one of auto, always, never; got 'x'$"
    ):
        OnlineGeneration(["Hi"], chat_template="x")
    with pytest.raises(ValueError, match=r"^guard held_out.chat_template must be one of auto, always, never; got 'x'$"):
        HeldOut(prompts=["Hi"], chat_template="x")
