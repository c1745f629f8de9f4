"""Multi-turn SFT (rlhf_lit.data.chat): which tokens of a conversation are trained, and truncation.

The expected tokens and trained positions are written out by hand from the rendered strings and
their tokens (tests/data/chat_by_hand.py), never computed with the function under test.
"""

from collections import Counter

import pytest
from chat_by_hand import CONV, END_MARKER_TEMPLATE, END_MARKER_TOKENS, FIRST_TURN, IDS, LAST_TURN, TOKENS
from data_assets import ASSETS
from transformers import AutoTokenizer

from rlhf_lit.data import chat
from rlhf_lit.data.chat import encode_conversations
from rlhf_lit.data.encoding import TextEncoder

CHAT_MODEL = ASSETS / "models" / "stories260K-chat"


def load_chat_tok(chat_template=None):
    """A fresh stories260K-chat tokenizer, with another chat template when given."""
    tok = AutoTokenizer.from_pretrained(str(CHAT_MODEL))
    if chat_template is not None:
        tok.chat_template = chat_template
    return tok


@pytest.fixture(scope="module")
def chat_tok():
    return load_chat_tok()


@pytest.fixture(scope="module")
def prefix_tok(chat_tok):
    """The chat model's template with its generation block removed: the prefix rule decides."""
    template = chat_tok.chat_template
    assert "{% generation %}" in template and "{% endgeneration %}" in template
    return load_chat_tok(template.replace("{% generation %}", "").replace("{% endgeneration %}", ""))


def encode(tok, convs, turns="all", max_prompt_length=100, max_length=100, counts=None, **encoder_kw):
    return encode_conversations(
        TextEncoder(tok, **encoder_kw),
        convs,
        turns=turns,
        max_prompt_length=max_prompt_length,
        max_length=max_length,
        counts=counts,
    )


def trained_positions(item):
    return [p for p, label in enumerate(item["labels"]) if label != -100]


def labels_at(ids, positions):
    return [t if p in positions else -100 for p, t in enumerate(ids)]


def test_generation_block_mask_by_hand(chat_tok, monkeypatch):
    # The template's own mask decides: the prefix rule must not even run.
    monkeypatch.setattr(chat, "_prefix_turns", lambda *a: pytest.fail("prefix rule used"))
    counts = Counter()
    [item] = encode(chat_tok, [CONV], counts=counts)
    assert chat_tok.convert_ids_to_tokens(item["input_ids"]) == TOKENS
    assert item["input_ids"] == IDS
    assert trained_positions(item) == FIRST_TURN + LAST_TURN
    assert item["labels"] == labels_at(IDS, FIRST_TURN + LAST_TURN)
    assert counts == Counter()


def test_prefix_rule_gives_the_generation_mask_on_the_chat_template(prefix_tok):
    # The span a turn adds is ' Hello.</s>\n' minus the trailing '\n': the same tokens as the
    # generation block ' ' + content + '</s>'; the '▁' after '</s>' sits on the '\n' (50-51), so it
    # is outside the span as well.
    assert not chat.GENERATION_BLOCK.search(prefix_tok.chat_template)
    [item] = encode(prefix_tok, [CONV])
    assert item["input_ids"] == IDS
    assert trained_positions(item) == FIRST_TURN + LAST_TURN


def test_prefix_rule_trains_a_token_straddling_the_start_of_the_turn(chat_tok):
    # The same rendering, but the header is 'Assistant: ' (trailing space) and the turn adds
    # 'Hello.</s>' (characters 40-50) and 'Bye.</s>' (74-82): '▁He' (39-42) and '▁B' (73-75) hold
    # the header's space and the response's first letters; they are trained.
    template = chat_tok.chat_template.replace(
        "{{ 'Assistant:' }}{% generation %}{{ ' ' + message['content'] + eos_token }}{% endgeneration %}",
        "{{ 'Assistant: ' + message['content'] + eos_token }}",
    ).replace("{{ 'Assistant:' }}{% endif %}", "{{ 'Assistant: ' }}{% endif %}")
    assert "{% generation %}" not in template and template.count("'Assistant: '") == 2
    [item] = encode(load_chat_tok(template), [CONV])
    assert item["input_ids"] == IDS
    assert trained_positions(item) == FIRST_TURN + LAST_TURN


def test_prefix_rule_trains_the_end_marker_and_not_the_trailing_newline():
    tok = load_chat_tok(END_MARKER_TEMPLATE)
    [item] = encode(tok, [CONV])
    assert tok.convert_ids_to_tokens(item["input_ids"]) == END_MARKER_TOKENS
    trained = [41, 42, 43, 44, 45, 46, 47, 48, 49, 76, 77, 78, 79, 80, 81, 82, 83]
    assert trained_positions(item) == trained
    assert item["labels"] == labels_at(item["input_ids"], trained)


@pytest.mark.parametrize("path", ["generation", "prefix"])
def test_last_turn_only(chat_tok, prefix_tok, path):
    [item] = encode(chat_tok if path == "generation" else prefix_tok, [CONV], turns="last")
    assert item["input_ids"] == IDS
    assert trained_positions(item) == LAST_TURN


def test_last_turn_only_with_the_end_marker():
    [item] = encode(load_chat_tok(END_MARKER_TEMPLATE), [CONV], turns="last")
    assert trained_positions(item) == [76, 77, 78, 79, 80, 81, 82, 83]


@pytest.mark.parametrize("broken", ["other ids", "one run for two turns"])
def test_unusable_template_mask_falls_back_to_the_prefix_rule(monkeypatch, broken):
    tok = load_chat_tok()
    original = tok.apply_chat_template

    def wrong_mask(conversation, **kw):
        out = original(conversation, **kw)
        if kw.get("return_assistant_tokens_mask"):
            if broken == "other ids":  # transformers tokenized differently: its mask is shifted
                out["input_ids"] = [[0] + ids for ids in out["input_ids"]]
                out["assistant_masks"] = [[0] + m for m in out["assistant_masks"]]
            else:  # one run from the first trained token to the end
                out["assistant_masks"] = [[int(p >= m.index(1)) for p in range(len(m))] for m in out["assistant_masks"]]
        return out

    monkeypatch.setattr(tok, "apply_chat_template", wrong_mask)
    [item] = encode(tok, [CONV])
    assert item["input_ids"] == IDS
    assert trained_positions(item) == FIRST_TURN + LAST_TURN


def test_prompt_cut_from_the_left_specials_kept(chat_tok):
    # The prompt is tokens 0-28 (before ' Hello'); 5 tokens: the encoder's '<s>' + tokens 25-28.
    counts = Counter()
    [item] = encode(chat_tok, [CONV], max_prompt_length=5, counts=counts)
    assert item["input_ids"] == [1, 413, 303, 413, 467] + IDS[29:]
    assert trained_positions(item) == [5, 6, 7, 8, 9, 29, 30, 31, 32, 33]
    assert counts == Counter(prompt=1)


def test_prompt_cut_from_the_left_keeps_the_template_bos_with_apply_chat_template(chat_tok):
    # The chat-template encoder adds no specials in front (the template writes '<s>'), but a left cut
    # keeps that '<s>' in front all the same: '<s>' + tokens 25-28, as without apply_chat_template.
    counts = Counter()
    [item] = encode(chat_tok, [CONV], max_prompt_length=5, counts=counts, apply_chat_template=True)
    assert item["input_ids"] == [1, 413, 303, 413, 467] + IDS[29:]
    assert trained_positions(item) == [5, 6, 7, 8, 9, 29, 30, 31, 32, 33]
    assert counts == Counter(prompt=1)


def test_conversation_cut_at_the_right(chat_tok):
    # 56 tokens keep ' B', 'y', 'e' of the last turn; '.', '</s>' and the newline are cut.
    counts = Counter()
    [item] = encode(chat_tok, [CONV], max_length=56, counts=counts)
    assert item["input_ids"] == IDS[:56]
    assert trained_positions(item) == FIRST_TURN + [53, 54, 55]
    assert counts == Counter(conversation=1)


def test_both_cuts(chat_tok):
    counts = Counter()
    [item] = encode(chat_tok, [CONV], max_prompt_length=5, max_length=8, counts=counts)
    assert item["input_ids"] == [1, 413, 303, 413, 467, 346, 306, 414]
    assert item["labels"] == [-100, -100, -100, -100, -100, 346, 306, 414]
    assert counts == Counter(prompt=1, conversation=1)


def test_example_whose_trained_tokens_are_all_cut_is_dropped(chat_tok):
    short = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Bye."}]
    # 'all': the first turn starts at 29, so max_length=40 keeps it. 'last': the prompt runs to
    # token 52 and 40 tokens keep nothing of the last turn: CONV is dropped, `short` stays.
    counts = Counter()
    items = encode(chat_tok, [CONV, short], turns="last", max_length=40, counts=counts)
    # `short`: '<s>User: Hi\nAssistant: Bye.</s>\n' ('▁U' is not in the vocabulary: '▁', 'U')
    assert [chat_tok.convert_ids_to_tokens(i["input_ids"]) for i in items] == [
        [
            "<s>",
            "▁",
            "U",
            "s",
            "er",
            ":",
            "▁H",
            "i",
            "<0x0A>",
            "A",
            "s",
            "s",
            "is",
            "t",
            "an",
            "t",
            ":",
            "▁B",
            "y",
            "e",
            ".",
            "</s>",
            "▁",
            "<0x0A>",
        ]
    ]
    assert trained_positions(items[0]) == [17, 18, 19, 20, 21]
    assert counts == Counter()  # a dropped example is not counted as a cut
    [kept] = encode(chat_tok, [CONV], turns="all", max_length=40)
    assert trained_positions(kept) == FIRST_TURN
    assert encode(chat_tok, [CONV], max_prompt_length=5, max_length=5, counts=counts) == []
    assert counts == Counter(prompt=1)


def test_template_that_does_not_continue_the_generation_prompt_is_refused():
    bot = (
        "{% for m in messages %}{% if m['role'] == 'assistant' %}{{ 'Bot: ' + m['content'] + '\\n' }}"
        "{% else %}{{ 'User: ' + m['content'] + '\\n' }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
    )
    with pytest.raises(ValueError) as e:
        encode(load_chat_tok(bot), [CONV])
    message = str(e.value)
    assert "stories260K-chat" in message
    assert "cannot be split into turns" in message
    assert "messages[:3]" in message and "add_generation_prompt=True" in message


def test_conversation_opening_with_the_assistant_needs_the_template_mask(chat_tok, prefix_tok):
    conv = [{"role": "assistant", "content": "Hello."}]
    # '<s>Assistant: Hello.</s>\n' is '<s>', '▁', 'A', 's', 's', 'is', 't', 'an', 't', ':', then the
    # generation block ' Hello.</s>' as tokens 10-14 ('▁He', 'll', 'o', '.', '</s>').
    [item] = encode(chat_tok, [conv])
    assert trained_positions(item) == [10, 11, 12, 13, 14]
    with pytest.raises(ValueError, match="starts with an assistant message"):
        encode(prefix_tok, [conv])


def test_template_that_renders_a_turn_differently_when_it_is_not_the_last_is_refused():
    # ' [done]' closes the conversation: messages[:3] end with it, the whole conversation does not
    # have it there, so the first turn's characters cannot be placed in the whole rendering.
    closing = (
        "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ 'assistant: ' }}{% else %}{{ ' [done]' }}{% endif %}"
    )
    with pytest.raises(ValueError, match=r"whole conversation does not start with the rendering of messages\[:3\]"):
        encode(load_chat_tok(closing), [CONV])


def test_tokenizer_without_chat_template_is_refused():
    tok = load_chat_tok()
    tok.chat_template = None
    with pytest.raises(ValueError, match="conversational but the tokenizer .*stories260K-chat' has no chat template"):
        encode(tok, [CONV])


def test_tokenizer_without_character_offsets_is_refused(monkeypatch):
    tok = load_chat_tok()
    monkeypatch.setattr(type(tok), "is_fast", property(lambda self: False))  # as a Python tokenizer
    with pytest.raises(ValueError, match="stories260K-chat' is not a fast tokenizer: .*character offsets"):
        encode(tok, [CONV])
