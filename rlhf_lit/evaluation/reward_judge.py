"""A reward model scoring (prompt, response) pairs: the labeller of ``rlhf-lit iterate`` (``labeler.kind:
reward_model``) and a judge (a reward-model export given where a judge is accepted: a gold reward model).

:class:`RewardModelScorer` encodes each pair as the reward model's data module encodes a record
(:class:`~rlhf_lit.data.encoding.TextEncoder`: a conversation rendered with its chat template, a response
ended as its training responses ended) with its own tokenizer, and reads its normalised score with
:func:`~rlhf_lit.models.reward_ensemble.reward_scores`, what ``rlhf-lit evaluate`` and ``best-of-n`` read of
``--reward-model`` (an ensemble: its members' mean).

:class:`RewardModelJudge` is one made from an rlhf-lit reward-model export (its ``rlhf_lit_export.json``
says ``what: reward model``, :data:`~rlhf_lit.artifacts.REWARD_MODEL_EXPORT`), which
:func:`rlhf_lit.evaluation.judges.load_judge` builds for a judge spec that is a directory. A judge is handed
each prompt as the policy read it (its text, rendered when the policy's prompts were) and the response's
text; the export records whether its prompts were rendered with its chat template
(:data:`~rlhf_lit.artifacts.CHAT_RENDERED_KEY`; an export without the entry: whether its tokenizer has a
template), and the judge reads them so: rendered prompts as they are, each response ended by the template's
end of turn, or plain prompts with the tokenizer's specials in front and each response ended by the EOS. A
prompt rendered otherwise than the reward model was trained on is refused, naming the judge.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: importing this module loads no model code
    from rlhf_lit.models.loading import ModelLoading


class RewardModelScorer:
    """A reward model (or ensemble) directory scoring prompt + response, encoded as its data module does.

    Args:
        path: the reward model's directory (its tokenizer beside it).
        device: where it scores (moved on a call that names another device).
        batch_size: rows per forward pass.
        loading: how it is loaded (:class:`~rlhf_lit.models.loading.ModelLoading`; None: the defaults).
        rendered: string prompts are texts already rendered with its chat template (the prompt a policy read),
            tokenized as they are, each response ended by the template's end of turn; else strings are plain
            text (the tokenizer's specials in front, the response ended by the EOS). Conversations are
            rendered either way.
    """

    def __init__(
        self,
        path: str,
        device: str = "cpu",
        batch_size: int = 32,
        loading: ModelLoading | None = None,
        rendered: bool = False,
    ) -> None:
        from rlhf_lit.models.loading import ModelLoading
        from rlhf_lit.models.reward_ensemble import load_any_reward_model
        from rlhf_lit.tokenizer import load_tokenizer

        self.path, self.loading, self.rendered = path, loading or ModelLoading(), rendered
        self.tokenizer = load_tokenizer(path, padding_side="right")
        self.model = load_any_reward_model(path, self.tokenizer, self.loading).to(device).eval()
        self.device, self.batch_size = str(device), batch_size

    def rows(self, prompts: Sequence[Any], responses: Sequence[Any]) -> list[list[int]]:
        """The ids the reward model reads for each (prompt, response): prompt + response + its end, encoded as its
        data module encodes a record (:class:`~rlhf_lit.data.encoding.TextEncoder`), not truncated."""
        from rlhf_lit.data.conversation import from_json, is_conversation
        from rlhf_lit.data.encoding import TextEncoder

        prompts, responses = [from_json(p) for p in prompts], [from_json(r) for r in responses]
        encoder = TextEncoder(self.tokenizer)
        if self.rendered and not any(map(is_conversation, prompts)):
            prompt_ids, response_ids, ends = encoder.encode_rendered_pairs(prompts, responses)
        else:
            prompt_ids, response_ids, ends = encoder.encode_pairs(prompts, responses)
        return [p + r + [e] for p, r, e in zip(prompt_ids, response_ids, ends)]

    def __call__(self, prompts: Sequence[Any], responses: Sequence[Any], device: str | None = None) -> list[float]:
        """Normalised scores (:func:`rlhf_lit.models.reward_ensemble.reward_scores`) of :meth:`rows`, on ``device``
        (the caller's; None: where the model is)."""
        import torch

        from rlhf_lit.functional import pad_ids
        from rlhf_lit.models.reward_ensemble import reward_scores

        if device is not None and str(device) != self.device:
            self.model.to(device)
            self.device = str(device)
        rows = self.rows(prompts, responses)
        scores: list[float] = []
        for start in range(0, len(rows), self.batch_size):
            ids, mask = pad_ids(rows[start : start + self.batch_size], int(self.tokenizer.pad_token_id), "right")
            with torch.no_grad():
                scores += reward_scores(self.model, ids.to(self.device), mask.to(self.device)).tolist()
        return scores


def read_reward_model_export(path: str, option: str = "judge") -> dict[str, Any]:
    """The marker of the reward-model export at ``path`` (its ``rlhf_lit_export.json``), checked; a
    ``ValueError`` naming ``option`` and the path for anything else: no such directory, a file, a directory
    rlhf-lit did not write, a damaged marker, an export of another kind of model."""
    from rlhf_lit.artifacts import EXPORT_MARKER, REWARD_MODEL_EXPORT
    from rlhf_lit.integrity import DamagedFile, check_json_file

    directory, said = os.path.expanduser(path), f"{option} {path}"
    wanted = f"a judge is module:function or the directory of a reward-model export ({EXPORT_MARKER} in it)"
    if not os.path.exists(directory):
        raise ValueError(f"{said}: no such directory; {wanted}")
    if not os.path.isdir(directory):
        raise ValueError(f"{said}: a file, not a directory; {wanted}")
    marker = os.path.join(directory, EXPORT_MARKER)
    if not os.path.isfile(marker):
        raise ValueError(f"{said}: not an rlhf-lit export (no {EXPORT_MARKER}); {wanted}")
    try:
        about = check_json_file(marker)
    except (DamagedFile, OSError) as damage:
        raise ValueError(f"{said}: its marker is damaged ({damage}); export the reward model again") from None
    if about.get("what") != REWARD_MODEL_EXPORT:
        raise ValueError(
            f"{said}: an rlhf-lit export of a {about.get('what', 'model of unknown kind')}, not of a "
            f"{REWARD_MODEL_EXPORT}; {wanted}"
        )
    return about


class RewardModelJudge(RewardModelScorer):
    """A reward-model export as a judge (see the module docstring): called by
    :func:`rlhf_lit.evaluation.judges.judge_scores` with the prompts as the policy read them and the
    responses' texts; one finite score each, else an error naming the export. Picklable (it reloads from
    its path: a spawned process gets its own copy).

    Args:
        path: the export directory (:func:`read_reward_model_export`).
        loading: how it is loaded (the caller's dtype and attention kernel); None: the defaults.
        device: where it scores until a call names the caller's device.
        option: the option that named it, for messages (``judge``, ``--judge``).
    """

    reads_prompts = True
    """Scores (prompt, response) pairs: :func:`~rlhf_lit.evaluation.judges.judge_scores` gives it the prompts."""

    def __init__(
        self, path: str, loading: ModelLoading | None = None, device: str = "cpu", option: str = "judge"
    ) -> None:
        from rlhf_lit.artifacts import CHAT_RENDERED_KEY
        from rlhf_lit.data.rendering import has_chat_template

        recorded = read_reward_model_export(path, option).get(CHAT_RENDERED_KEY)
        super().__init__(path, device, loading=loading)
        self.option = option
        self.rendered = bool(recorded) if recorded is not None else has_chat_template(self.tokenizer)

    def __call__(self, prompts: Sequence[str], responses: Sequence[str], device: str | None = None) -> list[float]:
        """The reward model's score of each (prompt as the policy read it, response text), checked finite."""
        self.check_rendering(prompts)
        scores = super().__call__(prompts, responses, device)
        for i, score in enumerate(scores):
            if not math.isfinite(score):
                raise ValueError(f"{self.option} {self.path} returned a non-finite score ({score}) for text {i}")
        return scores

    def check_rendering(self, prompts: Sequence[str]) -> None:
        """Refuse a prompt that a reward model trained on rendered prompts cannot read: one that does not end
        with its chat template's generation prompt
        (:attr:`~rlhf_lit.data.encoding.TextEncoder.generation_prompt`) was not rendered with that template.
        (The other way cannot be told: a plain HH-RLHF prompt ends with ``Assistant:`` too.)"""
        from rlhf_lit.data.encoding import TextEncoder

        asks = TextEncoder(self.tokenizer).generation_prompt.rstrip() if self.rendered else ""
        for i, prompt in enumerate(prompts if asks else ()):
            if not prompt.rstrip().endswith(asks):
                raise ValueError(
                    f"{self.option} {self.path}: prompt {i} did not reach the policy rendered with the reward "
                    f"model's chat template (it does not end with {asks!r}), but the reward model was trained on "
                    "prompts rendered with it; judge a policy that reads its prompts in that template "
                    "(chat_template / --chat-template), or with a reward model trained on plain prompts"
                )

    def __reduce__(self):
        return RewardModelJudge, (self.path, self.loading, self.device, self.option)

    def __repr__(self) -> str:
        return f"RewardModelJudge({self.path!r})"
