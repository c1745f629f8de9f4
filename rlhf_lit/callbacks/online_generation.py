"""Online generation: sample from a fixed prompt set every N rollouts and log a text table.

The callback works with any module that has ``policy``, ``tokenizer``, ``sampling``,
``rollout_index`` and ``score(query_responses, attention_mask) -> (B,)`` (the PPO stage); when the
module also has ``reward_model_inputs(generated)`` (PPO), the score reads the rows it returns, as the
rollout's reward does (``reward.unfinished``).
It samples with its own seed through :func:`generate_responses`, which never touches the
global RNG, so the training stream is the same with and without the callback. Its prompts are strings,
conversations (lists of messages), or a prompt source read as the data modules read theirs
(:class:`~rlhf_lit.data.prompt_source.PromptSource`: a file or hub dataset, a fit config's held-out split; a
string is a path), read for the module's tokenizer when fit starts; they reach the policy by the rule of
:mod:`rlhf_lit.data.prompt_rendering` (``chat_template``: rendered as one user turn with the tokenizer's chat
template when it has one, by default), logged once.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only

from rlhf_lit.data.prompt_rendering import RenderedPrompts, prompt_rendering, render_prompts, rendering_line
from rlhf_lit.data.prompt_source import PromptSource, as_prompt_set, as_source, given_prompts
from rlhf_lit.data.rendering import TemplateOption, template_choice

# The project's one judge loader; re-exported here for ``rlhf_lit.callbacks.load_judge``.
from rlhf_lit.evaluation import load_judge, response_texts
from rlhf_lit.evaluation.judges import JudgeReads, judge_scores, judge_texts
from rlhf_lit.functional import member_std, pad_ids
from rlhf_lit.models.generation import SamplingConfig, generate_responses
from rlhf_lit.option_values import check_least, check_seed

log = logging.getLogger(__name__)

__all__ = ["CallbackPrompts", "OnlineGeneration", "load_judge", "markdown_table"]

CallbackPrompts = str | list[str | list[dict[str, str]]] | dict[str, Any]
"""The prompts a callback takes (as a config writes them): strings or conversations (lists of messages), a path
(a file or a hub dataset name: ``PromptSource(path=...)``), or a prompt source's keys (``{path: ..., split: ...}``,
``{config: ..., split: val}``; a :class:`~rlhf_lit.data.prompt_source.PromptSource` object in Python). Typed
without the dataclass: jsonargparse would read a string naming an existing file as that file's contents."""


def _cell(text: str) -> str:
    """Text safe inside a markdown table cell."""
    return text.replace("|", "\\|").replace("\n", "<br>")


def markdown_table(prompts: list[str], responses: list[str], columns: dict[str, list[float]]) -> str:
    """A markdown table: prompt, response, then one column per score."""
    header = "| prompt | response | " + " | ".join(columns) + " |"
    rule = "|---|---|" + "---|" * len(columns)
    rows = [
        f"| {_cell(p)} | {_cell(r)} | " + " | ".join(f"{columns[c][i]:.4f}" for c in columns) + " |"
        for i, (p, r) in enumerate(zip(prompts, responses))
    ]
    return "\n".join([header, rule, *rows])


class OnlineGeneration(Callback):
    """Every ``every_n_rollouts`` rollouts, answer fixed prompts and log prompt, response and scores.

    All ranks generate (so a sharded policy keeps its collectives in step); rank 0 logs.

    Args:
        prompts: the fixed prompts: strings or conversations (lists of ``{role, content}`` messages ending
            on the user's turn, checked at construction), or a prompt source
            (:class:`~rlhf_lit.data.prompt_source.PromptSource`; a string is its path), read for the module's
            tokenizer when fit starts (:meth:`setup`); rendered and encoded with that tokenizer as
            ``chat_template`` says.
        every_n_rollouts: how often, in rollouts (after rollout n when ``n % every_n_rollouts == 0``).
        sampling: sampling settings; None = the module's.
        seed: seed of this callback's own generator (the same samples each time for a fixed policy).
        judge: optional extra scorer (loaded with :func:`rlhf_lit.evaluation.load_judge`): ``"module:function"``
            taking a list of texts, returning floats (e.g. ``rlhf_lit.evaluation.judges:vader``), or the
            directory of a reward-model export (scoring each prompt as the policy read it with its response,
            on the module's device).
        judge_reads: what a function judge reads: the response alone or prompt (as the policy read it,
            rendered when it was) + response (:data:`~rlhf_lit.evaluation.judges.JudgeReads`).
        tag: TensorBoard tag of the text table (scalars go under ``{tag}/``).
        chat_template: whether the prompts are rendered as one user turn with the module tokenizer's chat
            template (:data:`~rlhf_lit.data.rendering.TemplateChoice`): ``auto`` when it has one, ``always``,
            ``never`` (the deprecated aliases ``chat_template`` and ``raw``, removed in 0.3.0, are
            ``always`` and ``never``).
    """

    def __init__(
        self,
        prompts: CallbackPrompts,
        every_n_rollouts: int = 10,
        sampling: SamplingConfig | None = None,
        seed: int = 1234,
        judge: str | None = None,
        judge_reads: JudgeReads = "response",
        tag: str = "samples",
        chat_template: TemplateOption = "auto",
    ) -> None:
        check_least("every_n_rollouts", every_n_rollouts, 1)
        judge_texts([], [], judge_reads)  # an unknown judge_reads: the one message, at construction
        template_choice(chat_template, f"{type(self).__name__} chat_template")  # before fit, not at rollout n
        name = type(self).__name__
        self.prompts = (
            as_source(prompts) if isinstance(prompts, (str, dict, PromptSource)) else given_prompts(prompts, name)
        )  # a list checked now; a source read in setup, for the module's tokenizer
        self.every_n_rollouts, self.sampling = every_n_rollouts, sampling
        self.seed, self.judge_reads, self.tag, self.chat_template = seed, judge_reads, tag, chat_template
        check_seed("seed", seed)
        self.judge = load_judge(judge) if judge else None
        self.last_table: str | None = None
        self._rendered: RenderedPrompts | None = None
        self._shown: list[str] = []  # the prompts as the text table shows them, set with _rendered

    def rendered(self, tokenizer, training: bool | None = None) -> RenderedPrompts:
        """The prompts as the policy reads them, read and rendered once (the tokenizer is the module's, known at
        fit); ``auto`` follows ``training``, whether the training prompts were rendered, when known."""
        if self._rendered is None:
            name = f"{type(self).__name__} chat_template"
            prompt_set = as_prompt_set(self.prompts, tokenizer, self.chat_template, type(self).__name__, training)
            rendering = prompt_rendering(self.chat_template, tokenizer, name, prompt_set.format, training)
            rank_zero_info(rendering_line(f"{type(self).__name__} ({self.tag})", rendering, prompt_set.prompts))
            self._rendered = render_prompts(tokenizer, prompt_set.prompts, rendering)
            # the table's prompt column: a string as given, a conversation as the policy read it
            self._shown = [p if isinstance(p, str) else t for p, t in zip(prompt_set.prompts, self._rendered.texts)]
        return self._rendered

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Read and render the prompts when fit starts (the data module is set up by then), so a bad source is
        refused before any rollout."""
        if stage == "fit":
            self.rendered(pl_module.tokenizer, getattr(trainer.datamodule, "chat_rendered", None))

    @torch.no_grad()
    def sample(self, pl_module: LightningModule) -> tuple[list[str], dict[str, list[float]]]:
        """Responses to the fixed prompts and their scores (RM, and the judge when set)."""
        tokenizer = pl_module.tokenizer
        datamodule = getattr(getattr(pl_module, "_trainer", None), "datamodule", None)  # None outside fit
        prompts = self.rendered(tokenizer, getattr(datamodule, "chat_rendered", None))
        input_ids, attention_mask = pad_ids(prompts.ids, tokenizer.pad_token_id, "left")
        generated = generate_responses(
            pl_module.policy,
            input_ids.to(pl_module.device),
            attention_mask.to(pl_module.device),
            self.sampling or pl_module.sampling,
            eos_token_id=getattr(pl_module, "stop_ids", tokenizer.eos_token_id),
            pad_token_id=tokenizer.pad_token_id,
            generator=torch.Generator().manual_seed(self.seed),
        )
        # The rows PPO's reward reads (reward.unfinished: a cut response with EOS appended, or as sampled),
        # so the logged score is the proxy PPO optimises; a module without that method reads them as sampled.
        rows = getattr(pl_module, "reward_model_inputs", None)
        rows = rows(generated) if rows is not None else (generated.query_responses, generated.attention_mask)
        scores = pl_module.score(*rows).float()  # (B,) or (B, M)
        responses = response_texts(
            tokenizer, generated.query_responses, generated.attention_mask, generated.response_mask, generated.ended
        )  # decoded as the PPO stage's judge reads them
        if scores.dim() == 2:  # a reward-model ensemble: the members' mean and their std
            columns = {"score": scores.mean(dim=1).cpu().tolist(), "std": member_std(scores).cpu().tolist()}
        else:
            columns = {"score": scores.cpu().tolist()}
        if self.judge is not None:  # the rendered prompt, when it reads one; checked floats, one per response
            columns["judge"] = judge_scores(self.judge, prompts.texts, responses, self.judge_reads, pl_module.device)
        return responses, columns

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx) -> None:
        """Sample and log after every ``every_n_rollouts``-th rollout."""
        done = pl_module.rollout_index
        if done == 0 or done % self.every_n_rollouts != 0:
            return
        responses, columns = self.sample(pl_module)
        self.last_table = markdown_table(self._shown, responses, columns)
        # Logged at the index of the rollout just finished, next to that rollout's metrics.
        means = {f"{self.tag}/{k}_mean": sum(v) / len(v) for k, v in columns.items()}
        log_to_loggers(trainer, done - 1, means, self.tag, self.last_table)


@rank_zero_only
def log_to_loggers(trainer: Trainer, step: int, metrics: dict[str, float], tag: str, text: str) -> None:
    """On rank 0, ``metrics`` (when any) and ``text`` under ``tag`` (when any, to each logger that
    takes text: TensorBoard) at ``step``, in every logger of the run."""
    for logger in trainer.loggers:
        if metrics:
            logger.log_metrics(metrics, step=step)
        experiment = getattr(logger, "experiment", None)
        if text and hasattr(experiment, "add_text"):
            experiment.add_text(tag, text, global_step=step)
