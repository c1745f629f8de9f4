"""Conversational records: every shape read and every bad record's one message (the ids the chat template
renders: test_data_conversational_rendering.py)."""

import pytest
from data_assets import bot, user, write_jsonl
from data_assets import system as sys_

from rlhf_lit.data import InvalidRecord, SFTDataModule
from rlhf_lit.data.adapters import AdapterOptions, Example, Fields, adapt
from rlhf_lit.data.records import Row

OPT = AdapterOptions(Fields(), prompt_words=3)
WHERE = "data.jsonl line 3"


def read(record, format, kind):
    """The one example ``format`` reads from ``record`` as ``kind``."""
    (example,) = adapt([Row(WHERE, record)], format=format, kind=kind, options=OPT).examples
    return example


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
