"""Text examples -> token ids: special tokens, chat template, tokenizing the prompt/response
boundary, and the truncation rule shared by SFT and preference data.

Truncation rule:

1. The prompt. Special tokens the tokenizer adds in front of a text (e.g. llama's BOS) are put
   once at the start of the prompt (never before the response, and not again when the prompt's
   ids already start with them). Prompt tokens are truncated from the LEFT so that the prompt,
   specials included, has at most ``max_prompt_length`` tokens: the end of the prompt, nearest to
   the response, is kept (the specials stay in front).
2. The response. When the whole response plus one EOS fits in ``max_length - len(prompt)``, the
   EOS is appended (its label counts). Otherwise the response is cut from the right to fill
   ``max_length`` exactly and gets NO EOS: it did not end, and teaching the model to stop there
   would be wrong.
3. An example whose response keeps no token is dropped (the data module counts and logs these).

Boundary: the prompt is tokenized alone and prompt + response jointly; the response ids are the
joint ids after the prompt ids when those are a prefix of the joint ids (the usual case; it avoids
the spurious leading-space token that tokenizing ``" time"`` alone gives with sentencepiece), else
the response is tokenized on its own.

Chat template: a conversation prompt (:mod:`rlhf_lit.data.conversation`) is rendered by the
tokenizer's chat template with ``add_generation_prompt=True``, and a response after it is what the
template writes for prompt + response messages after that rendered prompt, trailing whitespace and
the end of turn removed: a trailing EOS string, since the EOS id is appended by rule 2, or the
template's own end-of-turn special token (``<|im_end|>``, Gemma's ``<end_of_turn>``), whose id rule 2
then appends in the EOS's place, so that a response ends as multi-turn SFT trains it and as PPO,
which stops at that token, hands it to the reward model (no EOS after it); a string response is one
assistant message, a string prompt before a conversation response one user message. With
``apply_chat_template=True`` string prompts and responses are rendered so too, as one user turn and
one assistant turn. The template writes its own special tokens, so none are added in front of a
rendered prompt; when it starts with the ones rule 1 puts in front (its BOS), a left cut keeps them
there as rule 1 does. A tokenizer without a chat template cannot render conversations: one error.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from functools import cached_property
from typing import Any

from rlhf_lit.data.conversation import Conversation, TextOrConversation, as_prompt, as_response, is_conversation
from rlhf_lit.data.rendering import has_chat_template, tokenizer_name
from rlhf_lit.functional.losses import IGNORE_INDEX


def require_tokenizer(tokenizer: Any, owner: str) -> Any:
    """The tokenizer, or a clear error when the CLI (or the caller) has not set it."""
    if tokenizer is None:
        raise ValueError(
            f"{owner}: tokenizer is None. It is set by the CLI from the model stage; when using "
            f"the data module directly pass tokenizer=load_tokenizer(...)"
        )
    return tokenizer


def special_prefix(tokenizer: Any) -> list[int]:
    """The special token ids the tokenizer puts in front of a text (``[bos]`` for llama, ``[]``
    for GPT-2); trailing specials (e.g. an EOS some tokenizers append) are not included."""
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a", add_special_tokens=True)["input_ids"]
    for k in range(len(full) - len(plain) + 1):
        if full[k : k + len(plain)] == plain:
            return list(full[:k])
    return []


class TextEncoder:
    """Renders and tokenizes prompts and responses for one tokenizer (see the module docstring).

    Args:
        tokenizer: a Hugging Face tokenizer.
        apply_chat_template: render prompts as a user turn and responses as the assistant turn.
    """

    def __init__(self, tokenizer: Any, *, apply_chat_template: bool = False):
        if apply_chat_template and not has_chat_template(tokenizer):
            raise ValueError(
                f"apply_chat_template=True but the tokenizer {tokenizer_name(tokenizer)!r} has no chat template; "
                "set apply_chat_template=False or use a tokenizer that has one"
            )
        self.tokenizer = tokenizer
        self.apply_chat_template = apply_chat_template
        # Put in front of plain-text prompts; a prompt the chat template rendered carries its own (the
        # template writes its BOS), and a left cut keeps them in front either way (truncate_prompt).
        self.prefix: list[int] = special_prefix(tokenizer)

    @property
    def eos_token_id(self) -> int:
        eos = self.tokenizer.eos_token_id
        if eos is None:
            raise ValueError("the tokenizer has no eos_token_id; responses must end with an EOS")
        return int(eos)

    # ------------------------------------------------------------------------------- rendering
    def require_chat_template(self) -> None:
        """Raise the one error for conversational data on a tokenizer without a chat template."""
        if not has_chat_template(self.tokenizer):
            raise ValueError(
                f"the data is conversational (lists of messages) but the tokenizer {tokenizer_name(self.tokenizer)!r} "
                "has no chat template to render them; use a tokenizer that has one, or data with string prompts and "
                "responses"
            )

    def _chat(self, messages: Conversation, *, add_generation_prompt: bool = False) -> str:
        """``messages`` rendered by the tokenizer's chat template; an error when it has none."""
        self.require_chat_template()
        return self.tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def _as_chat(self, prompt: TextOrConversation, response: TextOrConversation | None = None) -> bool:
        """Whether the prompt (and its response) are rendered by the chat template."""
        return self.apply_chat_template or is_conversation(prompt) or is_conversation(response)

    def render_prompt(self, prompt: TextOrConversation, response: TextOrConversation | None = None) -> str:
        """The prompt's text: itself, or rendered with the generation prompt (a conversation, or
        any prompt with ``apply_chat_template`` or before a conversation ``response``)."""
        if not self._as_chat(prompt, response):
            return prompt  # type: ignore[return-value]
        return self._chat(as_prompt(prompt), add_generation_prompt=True)

    def render_response(self, prompt: TextOrConversation, rendered_prompt: str, response: TextOrConversation) -> str:
        """The response's text: itself, or the template's rendering of prompt + response with
        ``rendered_prompt`` removed from its front and its end of turn from its end (see the module docstring)."""
        return self._response_and_end(prompt, rendered_prompt, response)[0]

    def _response_and_end(
        self, prompt: TextOrConversation, rendered_prompt: str, response: TextOrConversation
    ) -> tuple[str, str]:
        """(:meth:`render_response`, the end-of-turn token removed from its end, ``""`` for none)."""
        if not self._as_chat(prompt, response):
            return response, ""  # type: ignore[return-value]
        full = self._chat(as_prompt(prompt) + as_response(response))
        if not full.startswith(rendered_prompt):
            raise ValueError(
                "the chat template does not render the assistant turn as a continuation of the "
                "generation prompt (add_generation_prompt=True); cannot split prompt and response"
            )
        text = full[len(rendered_prompt) :].rstrip()
        end = self._end_of_turn(text)
        return text[: len(text) - len(end)], end

    def _end_of_turn(self, text: str) -> str:
        """The special token the template ended the rendered response ``text`` with: the EOS, or its
        own end of turn (``<|im_end|>``, ``<end_of_turn>``, ``<|end|>``); ``""`` when none."""
        eos = self.tokenizer.eos_token
        if eos and text.endswith(eos):
            return eos
        return max((t for t in self._special_tokens if text.endswith(t)), key=len, default="")

    @cached_property
    def _special_tokens(self) -> frozenset[str]:
        """The tokenizer's special tokens (named and added), built once: read for every rendered response."""
        added = getattr(self.tokenizer, "added_tokens_decoder", {}).values()
        named = getattr(self.tokenizer, "all_special_tokens", ())
        return frozenset(t for t in (*named, *(a.content for a in added if a.special)) if t)

    def _end_id(self, end: str) -> int:
        """The id that ends a response whose rendering ended with ``end`` (:meth:`_end_of_turn`): the
        template's own end of turn, else the EOS (rule 2)."""
        if end and end != self.tokenizer.eos_token:
            return int(self.tokenizer.convert_tokens_to_ids(end))
        return self.eos_token_id

    def end_of_turn_id(self) -> int | None:
        """The id the chat template ends an assistant turn with (its own end-of-turn token, else the
        EOS), read from the rendering of a one-exchange conversation; None when it ends with neither."""
        self.require_chat_template()
        prompt = ({"role": "user", "content": "x"},)
        _, end = self._response_and_end(prompt, self._chat(prompt, add_generation_prompt=True), "y")
        return self._end_id(end) if end else None

    # ------------------------------------------------------------------------------ tokenizing
    def _ids(self, texts: Sequence[str]) -> list[list[int]]:
        if not texts:
            return []
        return [list(x) for x in self.tokenizer(list(texts), add_special_tokens=False, verbose=False)["input_ids"]]

    def add_prefix(self, ids: list[int]) -> list[int]:
        """Specials in front, once."""
        n = len(self.prefix)
        return ids if ids[:n] == self.prefix else self.prefix + ids

    def _prefixed(self, ids: list[int], chat: bool) -> list[int]:
        """Prompt ids with the specials in front, unless the chat template rendered them (it writes its own)."""
        return ids if chat else self.add_prefix(ids)

    def encode_prompts(self, prompts: Sequence[TextOrConversation]) -> list[list[int]]:
        """Prompt ids (specials in front, not truncated)."""
        ids = self._ids([self.render_prompt(p) for p in prompts])
        return [self._prefixed(x, self._as_chat(p)) for p, x in zip(prompts, ids)]

    def encode_pairs(
        self, prompts: Sequence[TextOrConversation], responses: Sequence[TextOrConversation]
    ) -> tuple[list[list[int]], list[list[int]], list[int]]:
        """(prompt ids with specials, response ids, the id that ends each response), not truncated;
        see "Boundary" above. The end id is the EOS, or the chat template's own end of turn when it
        ends the assistant's turn with another special token (see "Chat template" above)."""
        rendered = [self.render_prompt(p, r) for p, r in zip(prompts, responses)]
        texts, ends = [], []
        for p, rp, r in zip(prompts, rendered, responses):
            text, end = self._response_and_end(p, rp, r)
            texts.append(text)
            ends.append(self._end_id(end))
        prompt_ids, response_ids = self._split_at_prompts(rendered, texts)
        chat = [self._as_chat(p, r) for p, r in zip(prompts, responses)]
        return [self._prefixed(p, c) for p, c in zip(prompt_ids, chat)], response_ids, ends

    def _split_at_prompts(self, rendered: list[str], texts: list[str]) -> tuple[list[list[int]], list[list[int]]]:
        """(prompt ids, response ids) of rendered prompts and their responses' texts: see "Boundary" above."""
        prompt_ids = self._ids(rendered)
        joint_ids = self._ids([rp + t for rp, t in zip(rendered, texts)])
        response_ids: list[list[int] | None] = []
        alone: list[int] = []  # examples whose response is tokenized on its own
        for i, (p, j) in enumerate(zip(prompt_ids, joint_ids)):
            if j[: len(p)] == p:
                response_ids.append(j[len(p) :])
            else:
                response_ids.append(None)
                alone.append(i)
        for i, ids in zip(alone, self._ids([texts[i] for i in alone])):
            response_ids[i] = ids
        return prompt_ids, response_ids  # type: ignore[return-value]

    @cached_property
    def generation_prompt(self) -> str:
        """What the chat template writes after a conversation for the assistant to answer it
        (``add_generation_prompt``): a rendered prompt ends with it. ``""`` without a template or without one."""
        if not has_chat_template(self.tokenizer):
            return ""
        turn = ({"role": "user", "content": "x"},)
        asked, said = self._chat(turn, add_generation_prompt=True), self._chat(turn)
        return asked[len(said) :] if asked.startswith(said) else ""

    def encode_rendered_pairs(
        self, prompts: Sequence[str], responses: Sequence[str]
    ) -> tuple[list[list[int]], list[list[int]], list[int]]:
        """:meth:`encode_pairs` of prompts given as the text a policy read in the chat template (rendered
        with the generation prompt, the template's specials written as text) and plain-text responses:
        each prompt tokenized as it is (the template wrote its specials: none are put in front), the
        response its continuation ("Boundary" above), ended as an assistant turn ends (the template's
        end of turn, :meth:`end_of_turn_id`, else the EOS). Not truncated."""
        prompt_ids, response_ids = self._split_at_prompts(list(prompts), list(responses))
        end = self.end_of_turn_id()
        return prompt_ids, response_ids, [self.eos_token_id if end is None else end] * len(prompt_ids)


def truncate_prompt(
    ids: list[int], prefix: list[int], max_prompt_length: int, counts: Counter | None = None
) -> list[int]:
    """Keep the specials in front and the LAST tokens of the prompt: at most
    ``max_prompt_length`` tokens in all. A cut is counted in ``counts["prompt"]``."""
    n = len(prefix) if ids[: len(prefix)] == prefix else 0
    keep = max_prompt_length - n
    if keep < 1:
        raise ValueError(
            f"max_prompt_length={max_prompt_length} leaves no room for prompt tokens after {n} special token(s)"
        )
    if len(ids) <= max_prompt_length:
        return ids
    if counts is not None:
        counts["prompt"] += 1
    return ids[:n] + ids[len(ids) - keep :]


def truncate_response(
    prompt_ids: list[int], response_ids: list[int], eos_token_id: int, max_length: int, counts: Counter | None = None
) -> list[int] | None:
    """The response ids to append to ``prompt_ids``: the whole response + EOS when that fits in
    ``max_length``, else the response cut from the right to fill it, without EOS (counted in
    ``counts["response"]``). None when no response token fits (or the response has none)."""
    room = max_length - len(prompt_ids)
    if room < 1 or not response_ids:
        return None
    if len(response_ids) + 1 <= room:
        return response_ids + [eos_token_id]
    if counts is not None:
        counts["response"] += 1
    return response_ids[:room]


def encode_sft(
    encoder: TextEncoder,
    prompts: Sequence[TextOrConversation],
    responses: Sequence[TextOrConversation],
    *,
    max_prompt_length: int,
    max_length: int,
    counts: Counter | None = None,
) -> list[dict[str, list[int]]]:
    """SFT items ``{"input_ids", "labels"}`` (labels -100 on the prompt) by the truncation rule
    above; examples whose response keeps no token are left out (the caller counts them). Shared
    by SFT data, the reward-normalisation reference set and the PPO-ptx source, so all three build
    prompt + response (+ EOS) identically. Cut prompts and responses are counted in ``counts``."""
    prompt_ids, response_ids, end_ids = encoder.encode_pairs(prompts, responses)
    items = []
    for p, r, end in zip(prompt_ids, response_ids, end_ids):
        p = truncate_prompt(p, encoder.prefix, max_prompt_length, counts)
        kept = truncate_response(p, r, end, max_length, counts)
        if kept is not None:
            items.append({"input_ids": p + kept, "labels": [IGNORE_INDEX] * len(p) + kept})
    return items
