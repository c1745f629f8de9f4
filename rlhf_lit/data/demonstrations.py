"""SFT examples of one source encoded (:func:`encode_demonstrations`), and the record a chat template
refuses named (:func:`refused_conversation`): what the data modules share when they tokenize."""

from __future__ import annotations

from collections import Counter

from rlhf_lit.data.adapters import Example
from rlhf_lit.data.chat import AssistantTurns, encode_conversations, require_chat_tokenizer
from rlhf_lit.data.encoding import TextEncoder, encode_sft
from rlhf_lit.data.rendering import tokenizer_name


def encode_demonstrations(
    encoder: TextEncoder,
    examples: list[Example],
    *,
    turns: AssistantTurns,
    max_prompt_length: int,
    max_length: int,
    counts: Counter | None = None,
) -> list[dict[str, list[int]]]:
    """SFT items ``{"input_ids", "labels"}`` of one source's SFT examples: whole conversations
    (``messages``) with the loss on their assistant turns (``turns``:
    :func:`~rlhf_lit.data.chat.encode_conversations`), else prompt + response pairs
    (:func:`~rlhf_lit.data.encoding.encode_sft`). Shared by SFT data, the reward-normalisation
    reference set and the PPO-ptx source. A source has one format, so its examples are all of one kind."""
    if examples and examples[0].messages is not None:
        encoder.require_chat_template()
        require_chat_tokenizer(encoder.tokenizer)

        def encode(some: list[Example]) -> list[dict[str, list[int]]]:
            return encode_conversations(
                encoder,
                [e.messages or () for e in some],
                turns=turns,
                max_prompt_length=max_prompt_length,
                max_length=max_length,
                counts=counts,
            )

        try:
            return encode(examples)
        except ValueError as error:  # a conversation the template cannot split into turns: which one
            for example in examples:
                try:
                    encode([example])
                except ValueError as own:
                    raise ValueError(f"{example.where}: {own}") from None
            raise error
    return encode_sft(
        encoder,
        [e.prompt for e in examples],
        [e.response or "" for e in examples],
        max_prompt_length=max_prompt_length,
        max_length=max_length,
        counts=counts,
    )


def template_errors() -> tuple[type[Exception], ...]:
    """The errors a chat template raises for a conversation it refuses (jinja2's ``TemplateError``,
    e.g. from its ``raise_exception``); none without jinja2, which rendering then needs anyway."""
    try:
        from jinja2 import TemplateError
    except ImportError:
        return ()
    return (TemplateError,)


def refused_conversation(encoder: TextEncoder, examples: list[Example], error: Exception) -> ValueError:
    """The one error for a conversation the tokenizer's chat template refuses to render (Gemma's
    refuses system messages, Llama 2's roles that do not alternate), naming the first such record:
    the batched encoding that raised does not say which one it was."""
    name = tokenizer_name(encoder.tokenizer)
    for example in examples:
        try:
            _render(encoder, example)
        except template_errors() as refusal:
            return ValueError(
                f"{example.where}: the chat template of tokenizer {name!r} cannot render this conversation: {refusal}"
            )
    return ValueError(f"the chat template of tokenizer {name!r} cannot render a conversation: {error}")


def _render(encoder: TextEncoder, example: Example) -> None:
    """Render every conversation of ``example`` as its encoding does (see :func:`refused_conversation`)."""
    if example.messages is not None:
        encoder.tokenizer.apply_chat_template(list(example.messages), tokenize=False)
        return
    responses = [example.response, example.chosen, example.rejected, *(example.responses or ())]
    responses = [r for r in responses if r is not None]
    for response in responses or [None]:
        rendered = encoder.render_prompt(example.prompt, response)
        if response is not None:
            encoder.render_response(example.prompt, rendered, response)
