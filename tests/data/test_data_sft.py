"""SFT data: labels, EOS, the truncation rule with exact ids, specials, chat template, splits."""

import copy
import logging

import pytest
import torch
from data_assets import ALPACA_V2, TINYSTORIES, write_jsonl

from rlhf_lit.data import Fields, SFTCollator, SFTDataModule
from rlhf_lit.data.encoding import truncate_prompt, truncate_response
from rlhf_lit.data.splits import split_by_fraction

# stories260K ids (sentencepiece; "<s>" = 1 is added in front, "</s>" = 2 is the EOS, pad 0):
#   "Once upon a"                      -> 403 407 261
#   "Once upon a time there was a cat" -> 403 407 261 | 378 383 286 261 280 294
#   "Hi there"                         -> 320 417 | 383
ONCE = [{"prompt": "Once upon a", "response": " time there was a cat"}]
HI = [{"prompt": "Hi", "response": " there"}]


def sft(tok, path, **kw):
    dm = SFTDataModule(tokenizer=tok, train_path=path, **kw)
    dm.setup("fit")
    return dm


def test_labels_count_response_and_eos_only(stories_tok, tmp_path):
    dm = sft(stories_tok, write_jsonl(tmp_path / "d.jsonl", ONCE + HI), max_length=64, max_prompt_length=32)
    batch = SFTCollator(dm.pad_token_id)(dm.train_dataset)
    assert batch["input_ids"].tolist() == [
        [1, 403, 407, 261, 378, 383, 286, 261, 280, 294, 2],
        [1, 320, 417, 383, 2, 0, 0, 0, 0, 0, 0],
    ]
    assert batch["attention_mask"].tolist() == [[1] * 11, [1] * 5 + [0] * 6]
    assert batch["labels"].tolist() == [
        [-100, -100, -100, -100, 378, 383, 286, 261, 280, 294, 2],
        [-100, -100, -100, 383, 2, -100, -100, -100, -100, -100, -100],
    ]
    assert all(v.dtype == torch.long for v in batch.values())
    # the train loader gives the same rows, shuffled with the seed
    loader_batch = next(iter(dm.train_dataloader()))
    assert sorted(map(tuple, loader_batch["input_ids"].tolist())) == sorted(map(tuple, batch["input_ids"].tolist()))


def test_truncation_rule_exact_ids(stories_tok, tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ONCE)
    # prompt cut from the LEFT to 3 tokens, BOS kept in front: [1, 407, 261] ("upon a");
    # 4 tokens of room: the 6 response tokens + EOS do not fit -> first 4, and no EOS
    dm = sft(stories_tok, path, max_length=7, max_prompt_length=3)
    assert dm.train_dataset == [
        {"input_ids": [1, 407, 261, 378, 383, 286, 261], "labels": [-100, -100, -100, 378, 383, 286, 261]}
    ]
    # room for the whole response but not its EOS: the response did not end there -> no EOS
    dm = sft(stories_tok, path, max_length=9, max_prompt_length=3)
    assert dm.train_dataset[0]["input_ids"] == [1, 407, 261, 378, 383, 286, 261, 280, 294]
    # one more token of room: the EOS fits and counts
    dm = sft(stories_tok, path, max_length=10, max_prompt_length=3)
    assert dm.train_dataset[0]["labels"] == [-100, -100, -100, 378, 383, 286, 261, 280, 294, 2]


def test_truncation_helpers():
    assert truncate_prompt([1, 5, 6, 7, 8], [1], 3) == [1, 7, 8]
    assert truncate_prompt([5, 6, 7, 8], [1], 3) == [6, 7, 8]  # no specials in front: none kept
    assert truncate_prompt([1, 5], [1], 3) == [1, 5]
    with pytest.raises(ValueError, match="leaves no room"):
        truncate_prompt([1, 5, 6], [1], 1)
    assert truncate_response([1, 5], [7, 8], eos_token_id=2, max_length=5) == [7, 8, 2]
    assert truncate_response([1, 5], [7, 8], eos_token_id=2, max_length=4) == [7, 8]
    assert truncate_response([1, 5], [7, 8], eos_token_id=2, max_length=3) == [7]
    assert truncate_response([1, 5], [], eos_token_id=2, max_length=9) is None  # dropped


def test_bos_added_once_even_if_prompt_has_it(stories_tok, tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "<s>Once upon a", "response": " time"}])
    ids = sft(stories_tok, path, max_length=32, max_prompt_length=16).train_dataset[0]["input_ids"]
    assert ids[0] == 1 and ids.count(1) == 1 and ids[-1] == 2


def test_gpt2_no_specials_and_pad_required(gpt2_tok, tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "Once upon a", "response": " time"}])
    with pytest.raises(ValueError, match="the tokenizer has no pad token"):
        sft(gpt2_tok, path)
    tok = copy.deepcopy(gpt2_tok)
    tok.pad_token = tok.eos_token
    # GPT-2 ids: "Once" 7454, " upon" 2402, " a" 257, " time" 640, EOS 50256; no BOS in front
    assert sft(tok, path).train_dataset == [
        {"input_ids": [7454, 2402, 257, 640, 50256], "labels": [-100, -100, -100, 640, 50256]}
    ]


CHAT = (
    "{% for m in messages %}{% if m['role'] == 'user' %}<s>User: {{ m['content'] }}\n"
    "{% else %}Bot: {{ m['content'] }}</s>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}Bot:{% endif %}"
)


def test_chat_template(stories_tok, tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "Hi", "response": "Hello"}])
    with pytest.raises(ValueError, match="^chat_template: always, but the tokenizer .* has no chat template"):
        sft(stories_tok, path, chat_template="always")
    tok = copy.deepcopy(stories_tok)
    tok.chat_template = CHAT
    item = sft(tok, path, chat_template="always").train_dataset[0]
    n_prompt = item["labels"].count(-100)
    # prompt "<s>User: Hi\nBot:" (the template's BOS, not a second one); response " Hello" + EOS
    assert tok.decode(item["input_ids"][:n_prompt]) == "<s> User: Hi\nBot:"
    assert item["input_ids"].count(1) == 1
    assert item["labels"][n_prompt:] == item["input_ids"][n_prompt:]
    assert tok.decode(item["input_ids"][n_prompt:]) == "Hello</s>"
    assert item["input_ids"][-1] == 2 and item["input_ids"][:-1].count(2) == 0  # one EOS


def test_val_fraction_seeded_and_disjoint(stories_tok):
    train, val = split_by_fraction(list(range(50)), 0.2, seed=3)
    assert (len(train), len(val)) == (40, 10)
    assert set(train).isdisjoint(val) and sorted(train + val) == list(range(50))
    assert split_by_fraction(list(range(50)), 0.2, seed=3) == (train, val)
    assert split_by_fraction(list(range(50)), 0.2, seed=4)[1] != val
    with pytest.raises(ValueError, match="gives 0 validation"):
        split_by_fraction(list(range(3)), 0.1, seed=0)

    def split(seed):
        dm = sft(
            stories_tok,
            str(TINYSTORIES),
            format="paragraphs",
            max_records=50,
            val_fraction=0.2,
            seed=seed,
            max_length=48,
            max_prompt_length=16,
        )
        return [tuple(x["input_ids"]) for x in dm.train_dataset], [tuple(x["input_ids"]) for x in dm.val_dataset]

    train, val = split(0)
    assert (len(train), len(val)) == (40, 10) and set(train).isdisjoint(val)
    assert split(0) == (train, val)
    assert split(1)[1] != val


def test_incompatible_settings_raise(stories_tok, tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ONCE)
    with pytest.raises(ValueError, match="either val_path .* or val_fraction .* not both"):
        SFTDataModule(tokenizer=stories_tok, train_path=path, val_path=path, val_fraction=0.1)
    with pytest.raises(ValueError, match="max_prompt_length < max_length"):
        SFTDataModule(tokenizer=stories_tok, train_path=path, max_length=8, max_prompt_length=8)
    with pytest.raises(ValueError, match="tokenizer is None. It is set by the CLI"):
        SFTDataModule(train_path=path).setup("fit")
    with pytest.raises(ValueError, match="only the 'paragraphs' format reads"):
        SFTDataModule(tokenizer=stories_tok, train_path=str(TINYSTORIES), format="fields").setup("fit")


def test_errors_name_file_line_field(stories_tok, tmp_path):
    records = [{"prompt": "a", "response": "b"}] * 2
    cases = [
        ([*records, '{"prompt": "a", "response": '], r"bad\.jsonl line 3: not valid JSON"),
        ([*records, {"prompt": "a"}], r"bad\.jsonl line 3: field 'response' missing \(record keys: prompt\)"),
        (
            [*records, {"prompt": ["a"], "response": "b"}],
            r"bad\.jsonl line 3: field 'prompt' must be a string, got list",
        ),
        ([*records, {"prompt": "a", "response": " "}], r"bad\.jsonl line 3: field 'response' is empty"),
    ]
    for lines, message in cases:
        path = write_jsonl(tmp_path / "bad.jsonl", lines)
        with pytest.raises(ValueError, match=message):
            sft(stories_tok, path)
        assert len(sft(stories_tok, path, skip_invalid=True).train_dataset) == 2


def test_hparams_hold_no_dataclass(stories_tok, tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"q": "Once upon a", "a": " time"}])
    dm = sft(stories_tok, path, fields=Fields(prompt="q", response="a"))
    assert len(dm.train_dataset) == 1
    assert "tokenizer" not in dm.hparams
    assert dm.hparams["fields"] == {
        "prompt": "q",
        "response": "a",
        "chosen": "chosen",
        "rejected": "rejected",
        "margin": None,
        "text": "text",
    }
    torch.save(dict(dm.hparams), tmp_path / "h.pt")
    torch.load(tmp_path / "h.pt", weights_only=True)
    # the saved dict rebuilds the module
    again = SFTDataModule(tokenizer=stories_tok, **dict(dm.hparams))
    assert again.fields == Fields(prompt="q", response="a")


def test_alpaca_asset_batches(stories_tok):
    dm = sft(
        stories_tok,
        str(ALPACA_V2),
        format="alpaca",
        skip_invalid=True,
        max_records=300,
        max_length=96,
        max_prompt_length=48,
        batch_size=4,
    )
    assert 0 < len(dm.train_dataset) < 300  # status filter
    batch = next(iter(dm.train_dataloader()))
    mask, labels, ids = batch["attention_mask"], batch["labels"], batch["input_ids"]
    assert ids.shape == labels.shape == mask.shape and ids.shape[0] == 4
    assert ((labels != -100) <= (mask == 1)).all()  # labels only on real tokens
    for row_ids, row_mask in zip(ids, mask):
        assert row_mask.tolist() == sorted(row_mask.tolist(), reverse=True)  # right padded
        assert row_ids[0] == 1


class _StubEncoder:
    """Gives the second example a response with no tokens (no real tokenizer does for non-empty
    text, which the adapters require), to exercise the drop-and-count path."""

    prefix = [1]
    eos_token_id = 2

    def encode_pairs(self, prompts, responses):
        return [[1, 5], [1, 6]], [[7], []], [2, 2]


def test_examples_with_no_response_token_are_dropped_and_counted(stories_tok, tmp_path, caplog):
    from rlhf_lit.data.adapters import Example

    dm = SFTDataModule(tokenizer=stories_tok, train_path="unused.jsonl", max_length=8, max_prompt_length=4)
    examples = [Example("l1", "a", response="b"), Example("l2", "c", response="d")]
    with caplog.at_level(logging.INFO, logger="rlhf_lit.data"):
        items = dm._encode_split(_StubEncoder(), examples, "train")
    assert items == [{"input_ids": [1, 5, 7, 2], "labels": [-100, -100, 7, 2]}]
    assert dm.stats == {"train_records": 2, "train_examples": 1, "train_dropped": 1}
    assert [r.getMessage() for r in caplog.records] == [
        "train: dropped 1 of 2 examples whose response keeps no token after truncation"
    ]
