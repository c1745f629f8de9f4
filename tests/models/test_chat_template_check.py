"""PPO refuses a reward model whose tokenizer renders conversations otherwise than the policy's
(``rlhf_lit.tokenizer.check_same_chat_template``): the RM reads the rendered ids as they are."""

import shutil

import pytest
from assets_paths import STORIES260K, STORIES260K_CHAT

from rlhf_lit.tokenizer import check_same_chat_template, load_tokenizer


@pytest.fixture(scope="module")
def chat_tokenizer():
    return load_tokenizer(str(STORIES260K_CHAT), padding_side="left")


def test_the_same_template_passes_and_a_model_without_a_tokenizer_cannot_be_checked(chat_tokenizer, tmp_path):
    check_same_chat_template(chat_tokenizer, str(STORIES260K_CHAT), "reward_model")
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(STORIES260K_CHAT / name, bare / name)
    check_same_chat_template(chat_tokenizer, str(bare), "reward_model")


def test_a_reward_model_without_the_template_or_with_another_is_refused(chat_tokenizer, tmp_path):
    with pytest.raises(
        ValueError,
        match=r"^reward_model .*stories260K: its tokenizer has no chat template, and the "
        r"prompts are rendered with the policy's template",
    ):
        check_same_chat_template(chat_tokenizer, str(STORIES260K), "reward_model")
    other = tmp_path / "other"
    shutil.copytree(STORIES260K_CHAT, other)
    config = (other / "tokenizer_config.json").read_text(encoding="utf-8").replace("Assistant:", "Bot:")
    (other / "tokenizer_config.json").write_text(config, encoding="utf-8")
    with pytest.raises(ValueError, match="has a chat template other than the policy's"):
        check_same_chat_template(chat_tokenizer, str(other), "reward_model")


def test_an_end_of_turn_that_does_not_stop_generation_is_refused(chat_tokenizer):
    from rlhf_lit.data.encoding import TextEncoder
    from rlhf_lit.stages.ppo.checks import check_end_of_turn_stops

    # The shipped template ends a turn with </s>, the EOS (id 2): it stops generation.
    assert TextEncoder(chat_tokenizer, apply_chat_template=True).end_of_turn_id() == 2
    check_end_of_turn_stops(2, [2], "</s>")
    check_end_of_turn_stops(None, [2], "")  # a template without an end-of-turn token: nothing to check
    # A template whose turn ends with its own token: refused unless that token stops generation.
    tok = load_tokenizer(str(STORIES260K_CHAT), padding_side="left")
    tok.add_special_tokens({"additional_special_tokens": ["<|end|>"]})
    tok.chat_template = tok.chat_template.replace("message['content'] + eos_token", "message['content'] + '<|end|>'")
    end = TextEncoder(tok, apply_chat_template=True).end_of_turn_id()
    assert end == tok.convert_tokens_to_ids("<|end|>") and end != tok.eos_token_id
    check_end_of_turn_stops(end, [2, end], "<|end|>")
    with pytest.raises(
        ValueError,
        match=rf"^the chat template ends the assistant's turn with '<\|end\|>' \(id {end}\), "
        r"which does not stop generation \(stop ids \[2\]\)",
    ):
        check_end_of_turn_stops(end, [2], "<|end|>")
