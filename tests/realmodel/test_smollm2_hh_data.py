"""HH-RLHF transcripts through the public data modules with SmolLM2's ChatML tokenizer, down to the ids.

The expected texts are written out by hand from the template (``tokenizer.chat_template``): SmolLM2's
template opens every conversation that has no system turn with a default system message, wraps each
turn as ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` and prompts generation with
``<|im_start|>assistant\\n``. A response is what the template adds after the prompt, its trailing
newline dropped, so it ends with ``<|im_end|>``: the EOS, and also the pad. Only the attention mask
tells the end of turn (counted) from the pads after it (not counted).
"""

from __future__ import annotations

import pytest

from rlhf_lit.data import PreferenceDataModule, PromptDataModule
from rlhf_lit.tokenizer import load_tokenizer

# Not slow: the tokenizer alone, well under a second once the model folder is built.
pytestmark = pytest.mark.realmodel

END = "<|im_end|>"
CHOSEN = "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Help me?\n\nAssistant: Sure."
REJECTED = "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Help me?\n\nAssistant: No, I will not help you with that."
SHORT = "\n\nHuman: Why?\n\nAssistant: Because."  # a one-exchange transcript: a shorter, left-padded prompt

SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
PROMPT = (
    SYSTEM + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
    "<|im_start|>user\nHelp me?<|im_end|>\n<|im_start|>assistant\n"
)
SHORT_PROMPT = SYSTEM + "<|im_start|>user\nWhy?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    """The tokenizer as a stage loads it (right padding, the default pad policy: the pad exists)."""
    return load_tokenizer(str(smollm2_path))


@pytest.fixture
def hh_file(tmp_path):
    import json

    path = tmp_path / "hh.jsonl"
    path.write_text(
        "".join(
            json.dumps(r) + "\n"
            for r in ({"chosen": CHOSEN, "rejected": REJECTED}, {"chosen": SHORT, "rejected": SHORT + " No."})
        )
    )
    return str(path)


def ids(tokenizer, text: str) -> list[int]:
    """``text`` tokenized whole, as the model reads it (the data modules encode prompt and response apart)."""
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_the_template_is_the_one_the_expected_texts_were_written_from(tokenizer):
    # If the fetched template changes, the hand-written texts below must be rewritten: say so first.
    assert "You are a helpful AI assistant named SmolLM" in tokenizer.chat_template
    assert tokenizer.pad_token == tokenizer.eos_token == END


def test_the_preference_batch_is_chatml_and_its_last_real_position_is_the_end_of_turn(tokenizer, hh_file):
    dm = PreferenceDataModule(tokenizer=tokenizer, train_path=hh_file, batch_size=1, max_records=1)
    dm.setup()
    assert dm.format == "hh_rlhf" and dm.chat_rendered
    batch = {k: v.tolist() for k, v in next(iter(dm.train_dataloader())).items()}
    end = tokenizer.convert_tokens_to_ids(END)
    chosen, rejected = (
        ids(tokenizer, PROMPT + "Sure." + END),
        ids(tokenizer, PROMPT + "No, I will not help you with that." + END),
    )
    assert len(chosen) < len(rejected)  # the chosen row is the padded one
    padding = len(rejected) - len(chosen)
    assert batch["chosen_input_ids"] == [chosen + [end] * padding]  # padded with <|im_end|> itself
    assert batch["chosen_attention_mask"] == [[1] * len(chosen) + [0] * padding]
    assert batch["rejected_input_ids"] == [rejected] and batch["rejected_attention_mask"] == [[1] * len(rejected)]
    assert batch["prompt_length"] == [len(ids(tokenizer, PROMPT))]
    for row, mask in (
        (batch["chosen_input_ids"][0], batch["chosen_attention_mask"][0]),
        (batch["rejected_input_ids"][0], batch["rejected_attention_mask"][0]),
    ):
        last = sum(mask) - 1  # the last position the mask counts: what a reward model reads
        assert row[last] == end and row[last - 1] != end  # the end of turn, right after the answer, not a pad
    assert (
        tokenizer.decode(batch["chosen_input_ids"][0][: sum(batch["chosen_attention_mask"][0])])
        == PROMPT + "Sure." + END
    )


def test_the_prompt_batch_is_chatml_left_padded_with_the_generation_prompt_last(tokenizer, hh_file):
    padded = load_tokenizer(tokenizer.name_or_path, padding_side="left")  # as PPO loads it
    dm = PromptDataModule(tokenizer=padded, train_path=hh_file, batch_size=2)
    dm.setup()
    batch = next(iter(dm.train_dataloader()))
    expected = {0: ids(tokenizer, PROMPT), 1: ids(tokenizer, SHORT_PROMPT)}
    width = max(map(len, expected.values()))
    end = tokenizer.convert_tokens_to_ids(END)
    for row, mask, index in zip(batch["input_ids"].tolist(), batch["attention_mask"].tolist(), batch["index"].tolist()):
        want = expected[index]
        assert row == [end] * (width - len(want)) + want
        assert mask == [0] * (width - len(want)) + [1] * len(want)
        assert row[-4:] == ids(tokenizer, "<|im_start|>assistant\n")  # <|im_start|> assistant \n
    assert sorted(batch["index"].tolist()) == [0, 1]
