"""Response texts: cut at the first EOS by position, without special tokens, leading space kept."""

from __future__ import annotations

import torch

from rlhf_lit.evaluation import response_texts
from rlhf_lit.tokenizer import load_tokenizer

EOS, PAD = 2, 0  # stories260K: eos 2, pad = <unk> 0


def test_response_texts_cut_at_eos_by_position_keep_leading_space(stories_path):
    tokenizer = load_tokenizer(stories_path, padding_side="left")
    # stories260K ids: <s>=1, ▁Once 403 ▁upon 407 ▁a 261 ▁time 378 | ▁The 291 ▁c 280 at 294 |
    # ▁happy 393 | ▁there 383 ▁was 286 ▁do 400 g 428 | ▁s 262 . 426. Prompts left padded to P = 5.
    query_responses = torch.tensor(
        [
            [1, 403, 407, 261, 378, 383, 286, 261, 400, 428],  # no EOS: all five response tokens
            [PAD, 1, 291, 280, 294, 262, 294, 426, EOS, 383],  # a real word (▁there) after EOS: dropped
            [PAD, PAD, PAD, 1, 393, EOS, 383, 286, PAD, PAD],  # EOS first: empty response
        ]
    )
    attention_mask = torch.tensor([[1] * 10, [0, 1, 1, 1, 1, 1, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1, 0, 0, 0, 0]])
    response_mask = torch.tensor([[True] * 5, [True] * 4 + [False], [True] + [False] * 4])
    ended = torch.tensor([False, True, True])
    texts = response_texts(tokenizer, query_responses, attention_mask, response_mask, ended)
    # "Once upon a time there was a dog" minus "Once upon a time": the leading space survives
    # (decoding the response ids alone gives "there was a dog"); no <s>, </s> or <unk> text.
    assert texts == [" there was a dog", " sat.", ""]


def test_prompt_texts_tokenize_back_to_the_ids_the_policy_read(stories_path):
    """A judge that reads prompt + response tokenizes the prompt text again (a reward model as the judge): the
    text must give back the ids the policy read. Decoded whole, a sentencepiece tokenizer writes a space after
    ``<s>`` that the rendered text did not have (``'<s> User: ...'``), one token more for the judge."""
    from assets_paths import STORIES260K_CHAT

    from rlhf_lit.data.prompt_rendering import TemplateRendering, render_prompts
    from rlhf_lit.evaluation.texts import prompt_texts
    from rlhf_lit.models.generation import complete_generation

    for model, rendering in ((STORIES260K_CHAT, True), (stories_path, False)):
        tokenizer = load_tokenizer(str(model), padding_side="left")
        texts, ids, _ = render_prompts(
            tokenizer, ["Tell me a story about a cat", "A dog"], TemplateRendering(rendering, "t")
        )
        width = max(map(len, ids))
        padded = torch.tensor([[PAD] * (width - len(x)) + x for x in ids])
        prompt_mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
        response = torch.tensor([[403, EOS], [407, EOS]])
        gen = complete_generation(torch.cat([padded, response], 1), prompt_mask, (EOS,), PAD)
        decoded = prompt_texts(tokenizer, gen)
        if rendering:  # the rendered text itself, as `rlhf-lit evaluate` hands it to a judge
            assert decoded == texts
        assert [tokenizer(t, add_special_tokens=False)["input_ids"] for t in decoded] == ids
    # A special token inside the prompt (a multi-turn rendering): each side of it comes back as it was.
    chat = load_tokenizer(str(STORIES260K_CHAT))
    ids = chat("<s>User: hi\nAssistant: yo</s>User: more\nAssistant:", add_special_tokens=False)["input_ids"]
    assert chat.eos_token_id in ids[1:-1]
    from rlhf_lit.evaluation.texts import rendered_text

    assert chat(rendered_text(chat, ids), add_special_tokens=False)["input_ids"] == ids
