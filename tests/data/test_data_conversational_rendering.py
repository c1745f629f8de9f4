"""Conversational records: the ids the chat template renders, checked against strings rendered by hand
(assets/models/stories260K-chat: ``<s>``, then ``System: ..\\n``, ``User: ..\\n``, ``Assistant: ..</s>\\n``
per message, and ``Assistant:`` as the generation prompt)."""

import pytest
from assets_paths import ASSETS
from data_assets import bot, user, write_jsonl
from data_assets import system as sys_
from transformers import AutoTokenizer

from rlhf_lit.data import PreferenceDataModule, PromptDataModule, RankingCollator, SFTDataModule

CHAT_MODEL = ASSETS / "models" / "stories260K-chat"


def ids(tok, text):
    """``text``'s token ids, without special tokens added."""
    return tok(text, add_special_tokens=False)["input_ids"]


# ------------------------------------------------------------------------------- rendered ids
def test_a_conversational_pair_renders_as_the_template_writes_it(chat_tok, tmp_path):
    record = {"prompt": [sys_("Be kind."), user("Hi")], "chosen": [bot("Hello")], "rejected": "Go away"}
    dm = PreferenceDataModule(tokenizer=chat_tok, train_path=write_jsonl(tmp_path / "p.jsonl", [record]))
    dm.setup()
    (item,) = dm.train_dataset
    prompt = "<s>System: Be kind.\nUser: Hi\nAssistant:"  # by hand, from the template
    p = ids(chat_tok, prompt)
    assert p[0] == 1 and p.count(1) == 1  # the template's <s>, no second BOS in front
    # the response is what the template adds after the prompt, without its "</s>\n": the EOS id is appended
    chosen = ids(chat_tok, prompt + " Hello")[len(p) :]
    rejected = ids(chat_tok, prompt + " Go away")[len(p) :]
    assert chat_tok.convert_ids_to_tokens(chosen) == ["▁He", "ll", "o"]
    assert item == {
        "chosen_input_ids": p + chosen + [2],
        "rejected_input_ids": p + rejected + [2],
        "prompt_length": len(p),
    }


def test_a_conversational_completion_trains_only_the_response(chat_tok, tmp_path):
    record = {"prompt": [user("Hi")], "completion": [bot("Hello")]}
    dm = SFTDataModule(tokenizer=chat_tok, train_path=write_jsonl(tmp_path / "s.jsonl", [record]))
    dm.setup()
    p = ids(chat_tok, "<s>User: Hi\nAssistant:")
    response = ids(chat_tok, "<s>User: Hi\nAssistant: Hello")[len(p) :]
    assert dm.train_dataset == [{"input_ids": p + response + [2], "labels": [-100] * len(p) + response + [2]}]


def test_conversational_prompts_end_with_the_generation_prompt(chat_tok, tmp_path):
    records = [{"messages": [sys_("S"), user("Hi"), bot("Hello")]}, {"prompt": [user("Tell me a story")]}]
    out = []
    for i, record in enumerate(records):
        dm = PromptDataModule(tokenizer=chat_tok, train_path=write_jsonl(tmp_path / f"{i}.jsonl", [record]))
        dm.setup()
        out.append(dm.train_dataset[0]["input_ids"])
    assert out == [
        ids(chat_tok, "<s>System: S\nUser: Hi\nAssistant:"),
        ids(chat_tok, "<s>User: Tell me a story\nAssistant:"),
    ]
    assert dm.chat_rendered  # PPO checks the reward model's template then
    for prompt in out:
        # "\nAssistant:" as the tokenizer splits it, read off by hand
        assert chat_tok.convert_ids_to_tokens(prompt[-9:]) == ["<0x0A>", "A", "s", "s", "is", "t", "an", "t", ":"]


def test_rankings_with_a_conversational_prompt_share_its_rendering(chat_tok, tmp_path):
    record = {"prompt": [user("Hi")], "responses": ["Hello", [bot("Go away")]]}
    dm = PreferenceDataModule(tokenizer=chat_tok, train_path=write_jsonl(tmp_path / "r.jsonl", [record]))
    dm.setup()
    assert dm.format == "rankings"
    p = ids(chat_tok, "<s>User: Hi\nAssistant:")
    rows = [p + ids(chat_tok, "<s>User: Hi\nAssistant:" + r)[len(p) :] + [2] for r in (" Hello", " Go away")]
    batch = RankingCollator(0)(dm.train_dataset)
    width = max(map(len, rows))
    assert batch["input_ids"].tolist() == [row + [0] * (width - len(row)) for row in rows]
    assert batch["rank"].tolist() == [0, 1] and batch["prompt_length"].tolist() == [len(p)] * 2


def test_messages_sft_trains_the_assistant_turns(chat_tok, tmp_path):
    record = {"messages": [user("Hi"), bot("Hello"), user("Bye"), bot("See you")]}
    path = write_jsonl(tmp_path / "m.jsonl", [record])
    first = "<s>User: Hi\nAssistant:"
    second = first + " Hello</s>\nUser: Bye\nAssistant:"
    whole = ids(chat_tok, second + " See you</s>\n")
    assert whole[: len(ids(chat_tok, second))] == ids(chat_tok, second)  # each part a prefix of the whole
    # trained: " Hello</s>" and " See you</s>" (the generation blocks); not the headers nor the newlines
    hello = ids(chat_tok, first + " Hello</s>")[len(ids(chat_tok, first)) :]
    see_you = ids(chat_tok, second + " See you</s>")[len(ids(chat_tok, second)) :]
    n1, n2 = len(ids(chat_tok, first)), len(ids(chat_tok, second))
    assert hello[-1] == see_you[-1] == 2  # the template's end of turn "</s>" is trained
    tail = len(whole) - n2 - len(see_you)  # the "\n" after the last turn ("▁", "<0x0A>" after </s>)
    assert chat_tok.convert_ids_to_tokens(whole[n2 + len(see_you) :]) == ["▁", "<0x0A>"]
    labels_all = [-100] * n1 + hello + [-100] * (n2 - n1 - len(hello)) + see_you + [-100] * tail
    labels_last = [-100] * n2 + see_you + [-100] * tail
    for turns, labels in (("all", labels_all), ("last", labels_last)):
        dm = SFTDataModule(tokenizer=chat_tok, train_path=path, assistant_turns=turns)
        dm.setup()
        assert dm.train_dataset == [{"input_ids": whole, "labels": labels}]
    assert "assistant_turns" not in SFTDataModule(tokenizer=chat_tok, train_path=path).hparams
    assert (
        SFTDataModule(tokenizer=chat_tok, train_path=path, assistant_turns="last").hparams["assistant_turns"] == "last"
    )


def test_no_chat_template_is_one_error(stories_tok, tmp_path):
    message = (
        f"the data is conversational (lists of messages) but the tokenizer {stories_tok.name_or_path!r} has no chat "
        "template to render them; use a tokenizer that has one, or data with string prompts and responses"
    )
    for module, record in [
        (SFTDataModule, {"messages": [user("Hi"), bot("Hello")]}),
        (SFTDataModule, {"prompt": "Hi", "completion": [bot("Hello")]}),
        (PromptDataModule, {"prompt": [user("Hi")]}),
    ]:
        with pytest.raises(ValueError) as e:
            module(tokenizer=stories_tok, train_path=write_jsonl(tmp_path / "d.jsonl", [record])).setup()
        assert str(e.value) == message


def test_no_specials_are_put_before_a_prompt_the_template_rendered(tmp_path):
    tok = AutoTokenizer.from_pretrained(str(CHAT_MODEL))
    tok.chat_template = tok.chat_template.replace("{{ bos_token }}", "")  # a template that writes no BOS
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": [user("Hi")]}, {"prompt": "Hi"}])
    dm = PromptDataModule(tokenizer=tok, train_path=path, format="fields", chat_template="never")
    dm.setup()
    # the conversation: as the template writes it; the string kept: BOS in front, as always
    assert [x["input_ids"] for x in dm.train_dataset] == [ids(tok, "User: Hi\nAssistant:"), [1] + ids(tok, "Hi")]


def test_string_prompts_are_chat_rendered_unless_told_never(chat_tok, tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "Hi"}])
    for chat_template, rendered in (("never", False), ("always", True), ("auto", True)):
        dm = PromptDataModule(tokenizer=chat_tok, train_path=path, chat_template=chat_template)
        dm.setup()
        assert dm.chat_rendered is rendered


def test_an_implicit_string_pair_is_tokenized_as_its_whole_text(chat_tok, tmp_path):
    # The pair reads as the text itself: no lone space token between prompt and response (a prompt
    # ending in a space tokenizes to a trailing '▁', and a response tokenized after it gets its own
    # '▁' again: "The sky is  blue."), and PPO's prompts end where the pair's prompt does.
    record = {"chosen": "The sky is blue.", "rejected": "The sky is red."}
    path = write_jsonl(tmp_path / "i.jsonl", [record])
    dm = PreferenceDataModule(tokenizer=chat_tok, train_path=path, chat_template="never")
    dm.setup()
    (item,) = dm.train_dataset
    p = [1] + ids(chat_tok, "The sky is")
    assert item == {
        "chosen_input_ids": [1] + ids(chat_tok, "The sky is blue.") + [2],
        "rejected_input_ids": [1] + ids(chat_tok, "The sky is red.") + [2],
        "prompt_length": len(p),
    }
    assert chat_tok.decode(item["chosen_input_ids"], skip_special_tokens=True) == "The sky is blue."
    prompts = PromptDataModule(tokenizer=chat_tok, train_path=path, chat_template="never")
    prompts.setup()
    assert prompts.train_dataset[0]["input_ids"] == p


@pytest.mark.parametrize("chat_template", ["never", "auto", "always"])
def test_a_prompt_cut_from_the_left_keeps_the_template_bos(chat_tok, tmp_path, chat_template):
    # '<s>System: <long>\nUser: Hi\nAssistant:' cut to 6 tokens: the template's '<s>' stays in front of
    # the last 5 ('is', 't', 'an', 't', ':' of 'Assistant:', read off by hand), in SFT
    # pairs, preference pairs and PPO prompts alike, whatever chat_template says.
    prompt = [sys_("Be kind and tell long stories about cats and dogs."), user("Hi")]
    p = ids(chat_tok, "<s>System: Be kind and tell long stories about cats and dogs.\nUser: Hi\nAssistant:")
    cut = [1] + p[-5:]
    assert chat_tok.convert_ids_to_tokens(cut) == ["<s>", "is", "t", "an", "t", ":"]
    hello = ids(chat_tok, "<s>User: Hi\nAssistant: Hello")[len(ids(chat_tok, "<s>User: Hi\nAssistant:")) :]
    common = {"tokenizer": chat_tok, "chat_template": chat_template, "max_prompt_length": 6}
    sft = SFTDataModule(
        train_path=write_jsonl(tmp_path / "s.jsonl", [{"prompt": prompt, "completion": "Hello"}]), **common
    )
    pairs = PreferenceDataModule(
        train_path=write_jsonl(tmp_path / "p.jsonl", [{"prompt": prompt, "chosen": "Hello", "rejected": "No"}]),
        **common,
    )
    prompts = PromptDataModule(train_path=write_jsonl(tmp_path / "q.jsonl", [{"prompt": prompt}]), **common)
    for dm in (sft, pairs, prompts):
        dm.setup()
    assert sft.train_dataset[0]["input_ids"] == cut + hello + [2]
    assert pairs.train_dataset[0]["chosen_input_ids"] == cut + hello + [2]
    assert prompts.train_dataset[0]["input_ids"] == cut


def test_a_conversation_the_prefix_rule_cannot_split_is_named_by_its_record(tmp_path):
    # Without {% generation %} blocks the turns are found by rendering up to each assistant message,
    # which a conversation opening with the assistant cannot be: the error names that record.
    tok = AutoTokenizer.from_pretrained(str(CHAT_MODEL))
    tok.chat_template = tok.chat_template.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    records = [{"messages": [user("Hi"), bot("Hello")]}, {"messages": [bot("Hello"), user("Hi"), bot("Bye")]}]
    path = write_jsonl(tmp_path / "m.jsonl", records)
    dm = SFTDataModule(tokenizer=tok, train_path=path)
    with pytest.raises(ValueError) as error:
        dm.setup()
    assert str(error.value).startswith(
        f"{path} line 2: the chat template of tokenizer '{CHAT_MODEL}' cannot be split into turns: the conversation "
        "starts with an assistant message"
    )


@pytest.fixture
def end_of_turn_tok():
    """The chat model's tokenizer with a template that ends the assistant's turn with its own special
    token '<|end|>' (id 512), not the EOS '</s>': as Gemma's '<end_of_turn>' or Phi-3's '<|end|>'."""
    tok = AutoTokenizer.from_pretrained(str(CHAT_MODEL))
    tok.add_special_tokens({"additional_special_tokens": ["<|end|>"]})
    assert tok.chat_template.count("+ eos_token") == 1
    tok.chat_template = tok.chat_template.replace("+ eos_token", "+ '<|end|>'")
    assert tok.convert_tokens_to_ids("<|end|>") == 512
    return tok


def test_a_response_ends_with_the_template_end_of_turn_and_no_eos_after_it(end_of_turn_tok, tmp_path):
    # PPO stops at the end of turn (a stop id) and its reward model reads that token last, so the
    # reward model's pairs end on it too; prompt / completion SFT and DPO train it as multi-turn SFT
    # does, without an EOS after it that generation never writes.
    tok = end_of_turn_tok
    p = ids(tok, "<s>User: Hi\nAssistant:")
    hello = ids(tok, "<s>User: Hi\nAssistant: Hello")[len(p) :]
    no = ids(tok, "<s>User: Hi\nAssistant: No")[len(p) :]
    pair = {"prompt": [user("Hi")], "chosen": [bot("Hello")], "rejected": "No"}
    pairs = PreferenceDataModule(tokenizer=tok, train_path=write_jsonl(tmp_path / "p.jsonl", [pair]))
    ranking = {"prompt": [user("Hi")], "responses": ["Hello", "No"]}
    rankings = PreferenceDataModule(tokenizer=tok, train_path=write_jsonl(tmp_path / "r.jsonl", [ranking]))
    completion = SFTDataModule(
        tokenizer=tok, train_path=write_jsonl(tmp_path / "c.jsonl", [{"prompt": [user("Hi")], "completion": "Hello"}])
    )
    conversation = {"messages": [user("Hi"), bot("Hello")]}
    messages = SFTDataModule(tokenizer=tok, train_path=write_jsonl(tmp_path / "m.jsonl", [conversation]))
    for dm in (pairs, rankings, completion, messages):
        dm.setup()
    assert pairs.train_dataset == [
        {"chosen_input_ids": p + hello + [512], "rejected_input_ids": p + no + [512], "prompt_length": len(p)}
    ]
    assert rankings.train_dataset[0]["input_ids"] == [p + hello + [512], p + no + [512]]
    sft = {"input_ids": p + hello + [512], "labels": [-100] * len(p) + hello + [512]}
    assert completion.train_dataset == [sft]
    # multi-turn SFT: the same tokens, then the template's newline after the turn, not trained
    (item,) = messages.train_dataset
    assert {k: v[: len(p) + len(hello) + 1] for k, v in item.items()} == sft
    assert set(item["labels"][len(p) + len(hello) + 1 :]) == {-100}


def test_a_prompt_module_names_the_end_of_turn_ppo_checks_stops_generation(end_of_turn_tok, chat_tok):
    # PPO asks the data module (stages never import rlhf_lit.data) for the id its check_chat_rendering
    # refuses when it does not stop generation: the template's own end of turn, else the EOS.
    assert PromptDataModule(tokenizer=end_of_turn_tok, train_path="unused.jsonl").end_of_turn_id() == 512
    assert PromptDataModule(tokenizer=chat_tok, train_path="unused.jsonl").end_of_turn_id() == chat_tok.eos_token_id
