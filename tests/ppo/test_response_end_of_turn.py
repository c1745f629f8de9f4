"""A cut response is read by the reward model with the token its training data ended every response with
(``reward.unfinished: with_eos``, ``--unfinished with_eos``): the EOS for plain text, and for prompts rendered
with a chat template the template's end of turn, which is not the EOS in every template (a Gemma-style
template ends a turn with a token of its own and lists it among the stop ids)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from assets_paths import STORIES260K_CHAT
from ppo_helpers import tiny_module
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from rlhf_lit.data.encoding import TextEncoder
from rlhf_lit.data.prompt_rendering import TemplateRendering, render_prompts
from rlhf_lit.evaluation.samples import load_models, sample_and_measure
from rlhf_lit.models.generation import SamplingConfig, complete_generation
from rlhf_lit.stages.ppo.checks import check_data_module
from rlhf_lit.stages.ppo.config import PPOConfig, RewardConfig
from rlhf_lit.tokenizer import load_tokenizer

TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ 'User: ' + message['content'] + '\\n' }}{% else %}{{ 'Assistant: ' + message['content'] + '<eot>\\n' }}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


@pytest.fixture(scope="module")
def eot_chat(tmp_path_factory):
    """stories260K-chat with a template that ends a turn with ``<eot>`` (a new special token, a stop id beside
    the EOS), as a policy folder and a reward-model folder; returns ``(policy, reward_model, eot id)``."""
    root = tmp_path_factory.mktemp("eot_chat")
    tokenizer = AutoTokenizer.from_pretrained(STORIES260K_CHAT)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<eot>"]})
    tokenizer.chat_template = TEMPLATE
    eot = tokenizer.convert_tokens_to_ids("<eot>")
    torch.manual_seed(0)
    for name, auto in (("policy", AutoModelForCausalLM), ("rm", AutoModelForSequenceClassification)):
        model = auto.from_pretrained(STORIES260K_CHAT, **({"num_labels": 1} if name == "rm" else {}))
        model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
        model.config.pad_token_id = tokenizer.pad_token_id
        if name == "policy":
            model.generation_config.eos_token_id = [tokenizer.eos_token_id, eot]
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return str(root / "policy"), str(root / "rm"), eot


def test_the_chat_data_ends_every_response_with_the_end_of_turn(eot_chat):
    tokenizer = load_tokenizer(eot_chat[0])
    _, _, ends = TextEncoder(tokenizer, apply_chat_template=True).encode_pairs(["Tell a story"], ["Once upon"])
    assert ends == [eot_chat[2]] != [tokenizer.eos_token_id]  # what the reward model is trained to read


def test_ppo_reads_a_cut_chat_response_at_the_end_of_turn(eot_chat):
    tokenizer = load_tokenizer(eot_chat[0], padding_side="left")
    eos, eot = tokenizer.eos_token_id, eot_chat[2]
    data = SimpleNamespace(batch_size=4, chat_rendered=True, end_of_turn_id=lambda: eot)
    stage = SimpleNamespace(
        trainer=SimpleNamespace(datamodule=data),
        sampling=SamplingConfig(),
        ppo=PPOConfig(minibatch_size=4),
        reward_cfg=RewardConfig(unfinished="with_eos"),
        tokenizer=tokenizer,
        stop_ids=(eos, eot),
        response_end_id=eos,
        hparams=SimpleNamespace(reward_model=eot_chat[1]),
    )
    check_data_module(stage)
    assert stage.response_end_id == eot
    data.chat_rendered = False  # plain prompts: the EOS, as the build set it
    stage.response_end_id = eos
    check_data_module(stage)
    assert stage.response_end_id == eos


def test_ppo_appends_its_response_end_id_to_a_cut_response():
    module = tiny_module(reward=RewardConfig(unfinished="with_eos"))
    assert module.response_end_id == module.tokenizer.eos_token_id  # plain prompts
    module.response_end_id = 7  # as check_data_module sets a chat template's end of turn
    prompt = torch.tensor([[1, 5, 6]])
    gen = complete_generation(torch.tensor([[1, 5, 6, 30, 31]]), torch.ones_like(prompt), (2,), 0)  # cut
    ids, mask = module.reward_model_inputs(gen)
    assert ids[0, mask[0].bool()].tolist() == [1, 5, 6, 30, 31, 7]


def test_rendered_prompts_carry_the_end_of_turn(eot_chat):
    tokenizer = load_tokenizer(eot_chat[0], padding_side="left")
    assert render_prompts(tokenizer, ["Tell a story"], TemplateRendering(True, "test")).end_of_turn == eot_chat[2]
    assert render_prompts(tokenizer, ["Tell a story"], TemplateRendering(False, "test")).end_of_turn is None


def test_evaluate_scores_a_cut_chat_response_at_the_end_of_turn(eot_chat, monkeypatch):
    import rlhf_lit.models.scoring as scoring

    read = []  # the rows the reward model reads, as sample_and_measure builds them
    rows = scoring.reward_model_rows
    monkeypatch.setattr(scoring, "reward_model_rows", lambda gen, *a: read.append((gen, rows(gen, *a))) or read[-1][1])
    policy, reward_model, eot = eot_chat
    for template, end in (("always", eot), ("never", load_tokenizer(policy).eos_token_id)):
        read.clear()
        models = load_models(
            policy, reward_model=reward_model, prompts=["Tell a story", "A cat"], chat_template=template
        )
        sampling = SamplingConfig(max_new_tokens=4)
        sample_and_measure(models, models.prompts, sampling, batch_size=2, seed=0, unfinished="with_eos")
        [(gen, (ids, mask))] = read
        assert not gen.ended.any()  # 4 new tokens: the stories run on
        for row in range(2):
            sampled = gen.query_responses[row, gen.attention_mask[row].bool()].tolist()
            assert ids[row, mask[row].bool()].tolist() == sampled + [end], template
