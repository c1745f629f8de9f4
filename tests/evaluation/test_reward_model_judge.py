"""A reward-model export as a judge, read as the export records its prompts were rendered
(rlhf_lit/evaluation/reward_judge.py): prompts rendered with its chat template are tokenized as the policy
read them and each response ends with the template's end of turn; a plain prompt given to a reward model
trained in its template is refused, naming the judge; the judge pickles by its path."""

from __future__ import annotations

import pickle

import pytest
import torch
from assets_paths import STORIES260K_CHAT
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from rlhf_lit.data.prompt_rendering import render_prompts
from rlhf_lit.data.rendering import TemplateRendering
from rlhf_lit.evaluation.judges import judge_scores, load_judge
from rlhf_lit.stages.export import save_pretrained_atomically

END = "<|end|>"
TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{% if m['role'] == 'assistant' %}"
    + END
    + "{% endif %}{{ '\\n' }}{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)
"""A chat template that writes no BOS and ends an assistant turn with its own special token, not the EOS: a
rendered prompt and a plain one are encoded differently at both ends."""


@pytest.fixture(scope="module")
def chat_rm(tmp_path_factory):
    """A stories260K reward model with :data:`TEMPLATE`, exported as the reward-model stage exports one trained on
    prompts rendered with its chat template (the export's marker: ``what: reward model``, ``chat_rendered: true``)."""
    tokenizer = AutoTokenizer.from_pretrained(STORIES260K_CHAT)
    tokenizer.add_special_tokens({"additional_special_tokens": [END]})
    tokenizer.chat_template = TEMPLATE
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(STORIES260K_CHAT, num_labels=1)
    model.resize_token_embeddings(len(tokenizer))
    path = tmp_path_factory.mktemp("chat-rm") / "rm"
    save_pretrained_atomically(model, tokenizer, path, "reward model", facts={"chat_rendered": True})
    return path, model.eval(), tokenizer


def test_a_chat_reward_model_reads_rendered_prompts_as_they_are_ended_by_its_end_of_turn(chat_rm):
    path, model, tokenizer = chat_rm
    texts = render_prompts(tokenizer, ["Once upon a time", "The cat"], TemplateRendering(True, "test")).texts
    responses = [" there was a dog.", " sat on the mat."]
    judge = load_judge(str(path))
    got = judge_scores(judge, texts, responses, "response")  # a reward model reads the prompts whatever reads says
    # By hand: the rendered text tokenized as it is (no BOS: the template writes none), the response after it,
    # then the template's end of turn, <|end|> (not the EOS).
    assert texts[0] == "user: Once upon a time\nassistant:"
    end = tokenizer.convert_tokens_to_ids(END)
    assert end not in (tokenizer.eos_token_id, tokenizer.unk_token_id)
    want = []
    for prompt, response in zip(texts, responses):
        row = torch.tensor([tokenizer(prompt + response, add_special_tokens=False)["input_ids"] + [end]])
        with torch.no_grad():
            want.append(model(input_ids=row, attention_mask=torch.ones_like(row)).logits[0, 0].item())
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want))


def test_a_chat_reward_model_refuses_a_prompt_outside_its_template(chat_rm):
    path, _, _ = chat_rm
    judge = load_judge(str(path), option="--judge")
    with pytest.raises(ValueError, match=rf"--judge {path}: prompt 1 did not reach the policy rendered with"):
        judge_scores(judge, ["user: a\nassistant:", "Once upon a time"], ["x", "y"], "response")


def test_a_reward_model_judge_pickles_by_its_path(chat_rm):
    path, _, _ = chat_rm
    judge = load_judge(str(path))
    again = pickle.loads(pickle.dumps(judge))
    assert repr(again) == repr(judge) and again.rendered is True
    prompt = "user: a\nassistant:"
    assert again([prompt], [" b"]) == judge([prompt], [" b"])
