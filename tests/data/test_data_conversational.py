"""Conversational records: every shape read, every bad record's one message, and the ids the chat
template renders, checked against strings rendered by hand (assets/models/stories260K-chat: ``<s>``,
then ``System: ..\\n``, ``User: ..\\n``, ``Assistant: ..</s>\\n`` per message, and ``Assistant:`` as the
generation prompt)."""

import pytest
from assets_paths import ASSETS
from data_assets import bot, user, write_jsonl
from data_assets import system as sys_
from transformers import AutoTokenizer

from rlhf_lit.data import InvalidRecord, PreferenceDataModule, PromptDataModule, RankingCollator, SFTDataModule
from rlhf_lit.data.adapters import AdapterOptions, Example, Fields, adapt
from rlhf_lit.data.records import Row

CHAT_MODEL = ASSETS / "models" / "stories260K-chat"
OPT = AdapterOptions(Fields(), prompt_words=3)
WHERE = "data.jsonl line 3"


def read(record, format, kind):
    """The one example ``format`` reads from ``record`` as ``kind``."""
    (example,) = adapt([Row(WHERE, record)], format=format, kind=kind, options=OPT).examples
    return example


def ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


# ------------------------------------------------------------------------------------ shapes read
def test_messages_sft_is_the_whole_conversation_and_prompts_drop_the_last_answer():
    conversation = [sys_("Be kind."), user("Hi"), bot("Hello"), user("Bye"), bot("See you")]
    # other keys of a message are ignored; the copies hold role and content only
    record = {"messages": [{**m, "name": "x"} for m in conversation]}
    assert read(record, "messages", "sft") == Example(
        WHERE, (sys_("Be kind."), user("Hi")), messages=tuple(conversation)
    )
    assert read(record, "messages", "prompt") == Example(WHERE, tuple(conversation[:4]))
    ends_on_user = {"messages": conversation[:4]}
    assert read(ends_on_user, "messages", "prompt") == Example(WHERE, tuple(conversation[:4]))


def test_prompt_completion_strings_and_conversations():
    assert read({"prompt": "Once upon a", "completion": " time"}, "prompt_completion", "sft") == Example(
        WHERE, "Once upon a", response=" time"
    )
    record = {"prompt": [sys_("S"), user("Hi")], "completion": [bot("Hello")]}
    assert read(record, "prompt_completion", "sft") == Example(WHERE, (sys_("S"), user("Hi")), response=(bot("Hello"),))
    assert read(record, "prompt_completion", "prompt") == Example(WHERE, (sys_("S"), user("Hi")))
    # a string completion after a conversation is one assistant message
    mixed = {"prompt": [user("Hi")], "completion": "Hello"}
    assert read(mixed, "prompt_completion", "sft") == Example(WHERE, (user("Hi"),), response=(bot("Hello"),))


def test_fields_pairs_with_conversations_turn_their_strings_into_messages():
    record = {"prompt": "Hi", "chosen": [bot("Hello")], "rejected": "Go away"}
    assert read(record, "fields", "preference") == Example(
        WHERE, (user("Hi"),), chosen=(bot("Hello"),), rejected=(bot("Go away"),)
    )
    # string pairs stay strings
    assert read({"prompt": "Hi", "chosen": "a", "rejected": "b"}, "fields", "preference") == Example(
        WHERE, "Hi", chosen="a", rejected="b"
    )


def test_pairs_that_repeat_the_prompt_in_their_conversations_are_read_without_it():
    # HuggingFaceH4/ultrafeedback_binarized: prompt a string, chosen / rejected the whole conversation.
    record = {"prompt": "Hi", "chosen": [user("Hi"), bot("Hello")], "rejected": [user("Hi"), bot("Go away")]}
    assert read(record, "fields", "preference") == Example(
        WHERE, (user("Hi"),), chosen=(bot("Hello"),), rejected=(bot("Go away"),)
    )
    # a first turn that is not the prompt is not stripped: the response must open with the assistant
    other = {"prompt": "Hi", "chosen": [user("Hey"), bot("Hello")], "rejected": [bot("Go away")]}
    with pytest.raises(InvalidRecord, match=r"field 'chosen\[0\]' is a user turn"):
        read(other, "fields", "preference")
    # the message named counts the prompt's turns: the turn after the repeated prompt is chosen[1]
    repeated = {"prompt": "Hi", "chosen": [user("Hi"), user("Hi")], "rejected": [bot("Go away")]}
    with pytest.raises(InvalidRecord, match=r"field 'chosen\[1\]' is a user turn"):
        read(repeated, "fields", "preference")


def test_implicit_prompt_of_strings_stops_before_the_last_whitespace():
    # common prefix "The sky is bl": moved back to the space, so "blue"/"black" stay whole and the
    # responses start with the space (TRL's extract_prompt does the same), as paragraphs responses do
    record = {"chosen": "The sky is blue today.", "rejected": "The sky is black."}
    assert read(record, "implicit_prompt", "preference") == Example(
        WHERE, "The sky is", chosen=" blue today.", rejected=" black."
    )
    assert read(record, "implicit_prompt", "sft") == Example(WHERE, "The sky is", response=" blue today.")
    assert read(record, "implicit_prompt", "prompt") == Example(WHERE, "The sky is")
    # one a prefix of the other: "a b" / "a b c" share "a b", moved back to "a"
    assert read({"chosen": "a b", "rejected": "a b c"}, "implicit_prompt", "preference") == Example(
        WHERE, "a", chosen=" b", rejected=" b c"
    )
    # a run of whitespace goes to the responses whole
    assert read({"chosen": "Q:\n\nyes", "rejected": "Q:\n\nno"}, "implicit_prompt", "preference") == Example(
        WHERE, "Q:", chosen="\n\nyes", rejected="\n\nno"
    )


def test_implicit_prompt_of_conversations_is_their_shared_messages():
    shared = [sys_("S"), user("Hi"), bot("Hello"), user("Again?")]
    record = {"chosen": [*shared, bot("Yes")], "rejected": [*shared, bot("No"), user("Why?"), bot("Because")]}
    assert read(record, "implicit_prompt", "preference") == Example(
        WHERE, tuple(shared), chosen=(bot("Yes"),), rejected=(bot("No"), user("Why?"), bot("Because"))
    )
    assert read(record, "implicit_prompt", "prompt") == Example(WHERE, tuple(shared))


def test_text_trains_the_whole_text():
    assert read({"text": "Once upon a time."}, "text", "sft") == Example(WHERE, "", response="Once upon a time.")


def test_rankings_with_a_conversational_prompt():
    record = {"prompt": [user("Hi")], "responses": ["Hello", [bot("Hey")], "Go"], "ranks": [0, 1, 1]}
    opt = AdapterOptions(Fields(ranks="ranks"), prompt_words=3)
    (example,) = adapt([Row(WHERE, record)], format="rankings", kind="preference", options=opt).examples
    assert example == Example(
        WHERE, (user("Hi"),), responses=((bot("Hello"),), (bot("Hey"),), (bot("Go"),)), ranks=(0, 1, 1)
    )


# ------------------------------------------------------------------------------------ bad records
BAD = [
    (
        {"messages": [user("Hi"), {"role": "bot", "content": "x"}]},
        "messages",
        "sft",
        "field 'messages[1]' has role 'bot'; known roles: system, user, assistant",
    ),
    (
        {"messages": [user("Hi"), "Hello"]},
        "messages",
        "sft",
        "field 'messages[1]' must be a message (an object with role and content), got str",
    ),
    ({"messages": [{"content": "Hi"}]}, "messages", "sft", "field 'messages[0]' has no 'role' (message keys: content)"),
    ({"messages": [{"role": "user"}]}, "messages", "sft", "field 'messages[0]' has no 'content' (message keys: role)"),
    (
        {"messages": [user("Hi"), {"role": "assistant", "content": 5}]},
        "messages",
        "sft",
        "field 'messages[1].content' must be a string, got int",
    ),
    ({"messages": [user("Hi"), bot(" ")]}, "messages", "sft", "field 'messages[1].content' is empty"),
    ({"messages": []}, "messages", "sft", "field 'messages' is empty"),
    ({"messages": "Hi"}, "messages", "sft", "field 'messages' must be a list of messages, got str"),
    ({"text": "x"}, "messages", "sft", "field 'messages' missing (record keys: text)"),
    (
        {"messages": [user("Hi"), bot("Hello"), user("Bye")]},
        "messages",
        "sft",
        "field 'messages[2]' ends the conversation on a user turn; SFT needs a conversation that ends with the "
        "assistant's response",
    ),
    (
        {"messages": [sys_("S"), bot("Hello")]},
        "messages",
        "prompt",
        "field 'messages[0]' ends the prompt on a system turn; a prompt must end with the user's turn",
    ),
    (
        {"messages": [bot("Hello")]},
        "messages",
        "prompt",
        "field 'messages' holds only an assistant turn; a prompt needs the user's turn",
    ),
    (
        {"prompt": [user("Hi"), bot("Hello")], "completion": "x"},
        "prompt_completion",
        "sft",
        "field 'prompt[1]' ends the prompt on an assistant turn; a prompt must end with the user's turn",
    ),
    (
        {"prompt": ["Hi"], "completion": "x"},
        "prompt_completion",
        "sft",
        "field 'prompt' must be a string, got list of str; a conversation is a list of messages (objects with role "
        "and content)",
    ),
    (
        {"prompt": [user("Hi")], "completion": [user("Hello")]},
        "prompt_completion",
        "sft",
        "field 'completion[0]' is a user turn; a response must start with the assistant's message",
    ),
    (
        {"prompt": [user("Hi")], "chosen": "Yes", "rejected": [bot("Yes")]},
        "fields",
        "preference",
        "fields 'chosen' and 'rejected' are the same; a pair must differ",
    ),
    (
        {"chosen": [user("Hi"), bot("A")], "rejected": [user("Hey"), bot("B")]},
        "implicit_prompt",
        "preference",
        "fields 'chosen' and 'rejected' share no first turn; an implicit prompt is the messages both start with",
    ),
    (
        {
            "chosen": [user("Hi"), bot("A"), user("X"), bot("B")],
            "rejected": [user("Hi"), bot("A"), user("Y"), bot("C")],
        },
        "implicit_prompt",
        "preference",
        "field 'chosen[2]' is a user turn; a response must start with the assistant's message",
    ),
    (
        {"chosen": [user("Hi"), bot("A")], "rejected": [user("Hi"), bot("A"), user("More")]},
        "implicit_prompt",
        "preference",
        "field 'chosen' has no message after the 2 it shares with the other; a response must follow the shared prompt",
    ),
    (
        {"chosen": [user("Hi"), bot("A")], "rejected": [user("Hi"), bot("A")]},
        "implicit_prompt",
        "preference",
        "fields 'chosen' and 'rejected' are the same; a pair must differ",
    ),
    (
        {"chosen": "Yes.", "rejected": "No."},
        "implicit_prompt",
        "preference",
        "fields 'chosen' and 'rejected' share no whole word at their start; an implicit prompt is the text both "
        "start with",
    ),
    (
        {"chosen": "It is ", "rejected": "It is now"},
        "implicit_prompt",
        "preference",
        "field 'chosen' has nothing after the prompt both share ('It is'); a response must follow it",
    ),
    (
        {"chosen": "A b", "rejected": [user("A b")]},
        "implicit_prompt",
        "preference",
        "fields 'chosen' and 'rejected' must both be strings or both conversations to share an implicit prompt",
    ),
    (
        {"prompt": "Hi", "responses": ["Yes", [bot("Yes")]]},
        "rankings",
        "preference",
        "field 'responses[1]' repeats 'responses[0]' (responses must differ)",
    ),
    (
        {"prompt": "Hi", "responses": ["Yes", [{"role": "bot", "content": "x"}]]},
        "rankings",
        "preference",
        "field 'responses[1][0]' has role 'bot'; known roles: system, user, assistant",
    ),
]


@pytest.mark.parametrize(("record", "format", "kind", "message"), BAD)
def test_each_bad_record_is_one_message_naming_place_and_field(record, format, kind, message):
    with pytest.raises(InvalidRecord) as e:
        adapt([Row(WHERE, record)], format=format, kind=kind, options=OPT)
    assert str(e.value) == f"{WHERE}: {message}"


def test_a_bad_message_in_a_file_names_the_file_and_line(chat_tok, tmp_path):
    good = {"messages": [user("Hi"), bot("Hello")]}
    path = write_jsonl(
        tmp_path / "data.jsonl", [good, good, {"messages": [user("Hi"), {"role": "bot", "content": "x"}]}]
    )
    with pytest.raises(InvalidRecord) as e:
        SFTDataModule(tokenizer=chat_tok, train_path=path).setup()
    assert str(e.value) == f"{path} line 3: field 'messages[1]' has role 'bot'; known roles: system, user, assistant"
    dm = SFTDataModule(tokenizer=chat_tok, train_path=path, skip_invalid=True)
    dm.setup()
    assert len(dm.train_dataset) == 2


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
