"""One vocabulary for "render strings with the chat template?": ``auto | always | never``,
with ``hh_render``'s older ``chat_template`` / ``raw`` as aliases (rlhf_lit/data/rendering.py).

Each alias must act exactly as its canonical value wherever the choice is made: the data modules
(``hh_render``; ``chat_template``, whose older ``apply_chat_template`` is its alias too), the callbacks
(``chat_template``), the resume check; the commands' ``--chat-template`` is tested through the CLI in
tests/cli/test_template_vocabulary_cli.py.
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


# ------------------------------------------------ the data modules' chat_template and its older apply_chat_template
STRINGS = [{"prompt": "Once upon", "response": " a time", "chosen": " a time", "rejected": " a day"}]
MODULES = [SFTDataModule, PreferenceDataModule, PromptDataModule]


@pytest.fixture
def strings_file(tmp_path):
    return write_jsonl(tmp_path / "strings.jsonl", STRINGS)


@pytest.mark.parametrize(("old", "canonical"), [(True, "always"), (False, "never")])
@pytest.mark.parametrize("module", MODULES)
def test_apply_chat_template_reads_as_its_choice_with_a_warning_naming_the_removal(
    module, old, canonical, chat_tok, strings_file
):
    with pytest.warns(FutureWarning, match=r"^apply_chat_template is deprecated, removed in 0\.3\.0: write chat_temp"):
        by_alias = module(tokenizer=chat_tok, train_path=strings_file, format="fields", apply_chat_template=old)
    by_name = module(tokenizer=chat_tok, train_path=strings_file, format="fields", chat_template=canonical)
    assert batches(by_alias) == batches(by_name)
    assert by_alias.chat_rendered is by_name.chat_rendered is old
    assert dict(by_alias.hparams) == dict(by_name.hparams)  # the alias is never recorded
    assert by_alias.hparams["chat_template"] == canonical


@pytest.mark.parametrize("module", MODULES)
def test_chat_template_and_apply_chat_template_together_are_refused_naming_both(module, chat_tok, strings_file):
    with pytest.raises(ValueError, match=r"^give chat_template \(never\) or apply_chat_template \(True\), not both"):
        module(tokenizer=chat_tok, train_path=strings_file, chat_template="never", apply_chat_template=True)


@pytest.mark.parametrize("module", MODULES)
def test_the_data_modules_refuse_a_bad_chat_template_and_always_without_a_template(module, gpt2, strings_file):
    with pytest.raises(ValueError, match=r"^chat_template must be one of auto, always, never; got 'yes'$"):
        module(tokenizer=gpt2, train_path=strings_file, chat_template="yes")
    dm = module(tokenizer=gpt2, train_path=strings_file, format="fields", chat_template="always")
    with pytest.raises(ValueError) as refused:
        dm.setup()
    assert str(refused.value) == (
        f"chat_template: always, but the tokenizer {gpt2.name_or_path!r} has no chat template to render the string "
        "prompts with; "
        "use chat_template: never (or auto) to keep them as strings, or a tokenizer that has one"
    )


def test_auto_keeps_language_modelling_text_and_always_renders_it(chat_tok, tmp_path):
    path = write_jsonl(tmp_path / "text.jsonl", [{"text": "Tom ran."}])
    ran = chat_tok("Tom ran.", add_special_tokens=False)["input_ids"]
    kept = SFTDataModule(tokenizer=chat_tok, train_path=path, format="text")
    kept.setup()
    assert kept.train_dataset[0]["input_ids"] == [1, *ran, 2]  # BOS, the text, EOS: no turns
    assert kept.hparams["chat_template"] == "never"
    rendered = SFTDataModule(tokenizer=chat_tok, train_path=path, format="text", chat_template="always")
    rendered.setup()
    # By hand from the template: an empty user turn, the text as the assistant's (its end of turn is the EOS).
    turns = chat_tok("<s>User: \nAssistant: Tom ran.</s>", add_special_tokens=False)["input_ids"]
    assert rendered.train_dataset[0]["input_ids"] == turns


def test_the_hyperparameters_record_how_the_strings_read(chat_tok, gpt2, strings_file, tmp_path):
    text = write_jsonl(tmp_path / "text.jsonl", [{"text": "Tom ran."}])
    conversations = write_jsonl(tmp_path / "c.jsonl", [{"prompt": [{"role": "user", "content": "Hi"}]}])
    cases = [
        (chat_tok, strings_file, {}, "always"),  # auto, a template: rendered
        (gpt2, strings_file, {}, "never"),  # auto, no template: kept
        (chat_tok, conversations, {}, "never"),  # no strings: nothing rendered by the option
        (chat_tok, conversations, {"chat_template": "always"}, "always"),
        (chat_tok, strings_file, {"ptx_path": text, "ptx_format": "text"}, "auto"),  # rendered prompts, kept text
        (chat_tok, strings_file, {"ptx_path": text, "ptx_format": "text", "chat_template": "always"}, "always"),
    ]
    for tok, path, options, recorded in cases:
        dm = PromptDataModule(tokenizer=tok, train_path=path, **options)
        assert dm.hparams["chat_template"] == options.get("chat_template", "auto")  # as given, before setup
        dm.setup()
        assert dm.hparams["chat_template"] == recorded, (path, options)


@pytest.mark.parametrize(("old", "same", "other"), [(True, "always", "never"), (False, "never", "always")])
def test_an_older_checkpoint_recording_apply_chat_template_resumes_as_its_choice(old, same, other):
    checkpoint = {"hyper_parameters": {}, "datamodule_hyper_parameters": {"apply_chat_template": old}}
    check_resume(checkpoint, {}, {"chat_template": same}, ())
    with pytest.raises(ResumeMismatch, match=rf"data.chat_template: checkpoint '{same}', now '{other}'"):
        check_resume(checkpoint, {}, {"chat_template": other}, ())
