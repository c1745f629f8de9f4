"""Multi-turn SFT (rlhf_lit.data.chat): which tokens of a conversation are trained, truncation."""

import pytest
from data_assets import ASSETS
from transformers import AutoTokenizer

from rlhf_lit.data.chat import encode_conversations
from rlhf_lit.data.encoding import TextEncoder

CHAT_MODEL = ASSETS / "models" / "stories260K-chat"

CONV = [
    {"role": "system", "content": "Be kind."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "More?"},
    {"role": "assistant", "content": "Bye."},
]


@pytest.fixture(scope="module")
def chat_tok():
    """stories260K-chat: the template marks ' ' + content + '</s>' with a generation block."""
    return AutoTokenizer.from_pretrained(str(CHAT_MODEL))


def test_generation_block_mask_trains_the_assistant_turns(chat_tok):
    [item] = encode_conversations(TextEncoder(chat_tok), [CONV], turns="all", max_prompt_length=100, max_length=100)
    trained = [p for p, label in enumerate(item["labels"]) if label != -100]
    assert trained == [29, 30, 31, 32, 33, 53, 54, 55, 56, 57]
