"""HH-RLHF transcripts as conversations (``hh_render``): through the public data modules, down to the
token ids of the chat template's rendering written out by hand; GPT-2 (no template) unchanged."""

import copy
import logging

import pytest
from data_assets import HH, bot, user, write_jsonl

from rlhf_lit.data import PreferenceDataModule, PromptDataModule, SFTDataModule
from rlhf_lit.data.adapters import AdapterOptions, Example, Fields, adapt
from rlhf_lit.data.records import Row, read_rows

CHOSEN = "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Help me?\n\nAssistant: Sure."
REJECTED = "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Help me?\n\nAssistant: No."
RECORD = {"chosen": CHOSEN, "rejected": REJECTED}

# stories260K-chat's template (assets/README.md): "<s>", "User: ..\n", "Assistant: ..</s>\n" per turn,
# generation prompt "Assistant:"; the response is what it writes after that: " Sure.</s>".
CHAT_PROMPT = "<s>User: Hi\nAssistant: Hello!</s>\nUser: Help me?\nAssistant:"
CHAT_CHOSEN = CHAT_PROMPT + " Sure.</s>"
CHAT_REJECTED = CHAT_PROMPT + " No.</s>"
# today's strings: the prompt up to and including the last "\n\nAssistant:", the response after it, then EOS
RAW_PROMPT = "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Help me?\n\nAssistant:"
CONVERSATIONS = AdapterOptions(Fields(), prompt_words=8, hh_conversations=True)


@pytest.fixture
def gpt2(gpt2_tok):
    tok = copy.deepcopy(gpt2_tok)
    tok.pad_token = tok.eos_token
    return tok


@pytest.fixture
def hh_file(tmp_path):
    return write_jsonl(tmp_path / "hh.jsonl", [RECORD])


def ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def one_batch(dm, loader="train_dataloader"):
    dm.setup()
    return {k: v.tolist() if hasattr(v, "tolist") else v for k, v in next(iter(getattr(dm, loader)())).items()}


# ----------------------------------------------------------------------- the transcript's turns
def test_a_two_exchange_transcript_is_read_as_its_turns():
    row = Row("hh line 1", RECORD)
    prompt = (user("Hi"), bot("Hello!"), user("Help me?"))
    pair = adapt([row], format="hh_rlhf", kind="preference", options=CONVERSATIONS).examples
    assert pair == [Example("hh line 1", prompt, chosen=(bot("Sure."),), rejected=(bot("No."),))]
    sft = adapt([row], format="hh_rlhf", kind="sft", options=CONVERSATIONS).examples
    assert sft == [Example("hh line 1", prompt, response=(bot("Sure."),))]
    assert adapt([row], format="hh_rlhf", kind="prompt", options=CONVERSATIONS).examples == [
        Example("hh line 1", prompt)
    ]


def test_only_the_one_space_after_a_marker_is_dropped_and_paragraphs_stay_in_their_turn():
    chosen = "\n\nHuman:  Two spaces\n\nAssistant: One.\n\nTwo.\n\nHuman: x\n\nAssistant:y"
    (example,) = adapt(
        [Row("w", {"chosen": chosen, "rejected": "-"})], format="hh_rlhf", kind="sft", options=CONVERSATIONS
    ).examples
    assert example.prompt == (user(" Two spaces"), bot("One.\n\nTwo."), user("x"))
    assert example.response == (bot("y"),)


MALFORMED = {
    "no Human turn": ("\n\nAssistant: Hi", "chosen does not open with a '\\n\\nHuman:' turn"),
    "text before it": ("Hi\n\nHuman: Yo\n\nAssistant: No", "chosen does not open with a '\\n\\nHuman:' turn"),
    "two Human turns": (
        "\n\nHuman: A\n\nHuman: B\n\nAssistant: C",
        "chosen has two turns of one role in a row (turns must alternate Human, Assistant)",
    ),
    "ends on Human": (
        "\n\nHuman: A\n\nAssistant: B\n\nHuman: C",
        "chosen ends on a Human turn (no assistant response after it)",
    ),
    "empty turn": (
        "\n\nHuman: A\n\nAssistant: \n\nHuman: C\n\nAssistant: D",
        "chosen has an empty turn before its last",
    ),
    "no Assistant": ("\n\nHuman: A", "no '\\n\\nAssistant:' in chosen"),
    "empty answer": ("\n\nHuman: A\n\nAssistant: ", "empty chosen after the last '\\n\\nAssistant:'"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_transcript_is_skipped_and_counted_with_its_reason(case, caplog):
    chosen, reason = MALFORMED[case]
    rows = [Row("hh line 1", {"chosen": chosen, "rejected": chosen}), Row("hh line 2", RECORD)]
    with caplog.at_level(logging.INFO, logger="rlhf_lit.data"):
        out = adapt(rows, format="hh_rlhf", kind="sft", options=CONVERSATIONS, source="hh.jsonl")
    assert [e.where for e in out.examples] == ["hh line 2"]
    assert f"hh.jsonl: skipped 1 of 2 records ({reason})" in [r.getMessage() for r in caplog.records]


def test_pairs_whose_turns_differ_before_the_last_answer_are_skipped():
    rejected = "\n\nHuman: Hi\n\nAssistant: Hey!\n\nHuman: Help me?\n\nAssistant: No."
    out = adapt(
        [Row("w", {"chosen": CHOSEN, "rejected": rejected})], format="hh_rlhf", kind="preference", options=CONVERSATIONS
    )
    assert out.examples == []
    assert dict(out.skipped) == {"chosen and rejected do not share the prompt up to the last '\\n\\nAssistant:'": 1}
    bad = adapt(
        [Row("w", {"chosen": CHOSEN, "rejected": "\n\nHuman: Hi\n\nAssistant: "})],
        format="hh_rlhf",
        kind="preference",
        options=CONVERSATIONS,
    )
    assert dict(bad.skipped) == {"chosen and rejected do not share the prompt up to the last '\\n\\nAssistant:'": 1}


def test_the_hh_asset_reads_as_alternating_turns_without_markers():
    out = adapt(read_rows(str(HH)), format="hh_rlhf", kind="preference", options=CONVERSATIONS)
    assert len(out.examples) > 2000
    for e in out.examples:
        roles = [m["role"] for m in e.prompt]
        assert roles == ["user", "assistant"] * (len(roles) // 2) + ["user"]
        assert [m["role"] for m in e.chosen + e.rejected] == ["assistant", "assistant"]
        assert not any(
            "\n\nHuman:" in m["content"] or "\n\nAssistant:" in m["content"] for m in e.prompt + e.chosen + e.rejected
        )


# ------------------------------------------------------------- the data modules, chat template
def test_sft_batch_is_the_template_conversation_down_to_the_ids(chat_tok, hh_file):
    batch = one_batch(SFTDataModule(tokenizer=chat_tok, train_path=hh_file, format="hh_rlhf", batch_size=1))
    (input_ids,), (labels,) = batch["input_ids"], batch["labels"]
    assert input_ids == ids(chat_tok, CHAT_CHOSEN)
    n = len(ids(chat_tok, CHAT_PROMPT))
    assert ids(chat_tok, CHAT_CHOSEN)[:n] == ids(chat_tok, CHAT_PROMPT)  # the prompt's ids start the sequence
    assert labels == [-100] * n + input_ids[n:]  # exactly the response is trained
    assert chat_tok.decode(input_ids[n:]) == "Sure.</s>" and input_ids[-1] == chat_tok.eos_token_id
    assert "Human:" not in chat_tok.decode(input_ids)


def test_preference_batch_is_the_template_conversation_down_to_the_ids(chat_tok, hh_file):
    dm = PreferenceDataModule(tokenizer=chat_tok, train_path=hh_file, batch_size=1)  # format auto reads hh_rlhf
    batch = one_batch(dm)
    assert dm.format == "hh_rlhf" and dm.chat_rendered
    assert batch["chosen_input_ids"] == [ids(chat_tok, CHAT_CHOSEN)]
    rejected = ids(chat_tok, CHAT_REJECTED)  # padded to the chosen's length with the pad id (<unk> = 0)
    padding = len(batch["chosen_input_ids"][0]) - len(rejected)
    assert batch["rejected_input_ids"] == [rejected + [chat_tok.pad_token_id] * padding]
    assert batch["rejected_attention_mask"] == [[1] * len(rejected) + [0] * padding]
    assert batch["prompt_length"] == [len(ids(chat_tok, CHAT_PROMPT))]
    assert "Human:" not in chat_tok.decode(batch["chosen_input_ids"][0])


def test_prompt_batch_ends_with_the_generation_prompt(chat_tok, hh_file):
    batch = one_batch(PromptDataModule(tokenizer=chat_tok, train_path=hh_file, batch_size=1))
    assert batch["input_ids"] == [ids(chat_tok, CHAT_PROMPT)]
    text = chat_tok.decode(batch["input_ids"][0])
    assert text.endswith("\nUser: Help me?\nAssistant:") and "Human:" not in text


def test_the_reference_and_ptx_sources_render_hh_the_same_way(chat_tok, tmp_path, hh_file):
    pairs = write_jsonl(
        tmp_path / "pairs.jsonl", [{"prompt": [user("A")], "chosen": [bot("B")], "rejected": [bot("C")]}]
    )
    dm = PreferenceDataModule(tokenizer=chat_tok, train_path=pairs, reference_path=hh_file, reference_format="hh_rlhf")
    dm.setup()
    assert [item["input_ids"] for item in dm.reference_dataset] == [ids(chat_tok, CHAT_CHOSEN)]
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": [user("A")]}])
    dm = PromptDataModule(tokenizer=chat_tok, train_path=prompts, ptx_path=hh_file, ptx_format="hh_rlhf")
    dm.setup()
    n = len(ids(chat_tok, CHAT_PROMPT))
    assert dm.ptx_dataset == [
        {"input_ids": ids(chat_tok, CHAT_CHOSEN), "labels": [-100] * n + ids(chat_tok, CHAT_CHOSEN)[n:]}
    ]


# ------------------------------------------------------------------- GPT-2: raw, as before
def test_gpt2_keeps_the_raw_strings_byte_for_byte(gpt2, hh_file):
    raw = RAW_PROMPT + " Sure."
    sft = one_batch(SFTDataModule(tokenizer=gpt2, train_path=hh_file, format="hh_rlhf", batch_size=1))
    assert sft["input_ids"] == [ids(gpt2, raw) + [50256]]
    assert gpt2.decode(sft["input_ids"][0]) == raw + "<|endoftext|>"
    n = len(ids(gpt2, RAW_PROMPT))
    assert sft["labels"] == [[-100] * n + ids(gpt2, raw)[n:] + [50256]]
    pairs = one_batch(PreferenceDataModule(tokenizer=gpt2, train_path=hh_file, batch_size=1))
    assert gpt2.decode(pairs["chosen_input_ids"][0]) == raw + "<|endoftext|>"
    assert gpt2.decode(pairs["rejected_input_ids"][0]).startswith(RAW_PROMPT + " No.<|endoftext|>")
    prompts = one_batch(PromptDataModule(tokenizer=gpt2, train_path=hh_file, batch_size=1))
    assert gpt2.decode(prompts["input_ids"][0]) == RAW_PROMPT


# ------------------------------------------------------------ the option: refusal, log, hparams
def test_chat_template_without_a_template_is_refused_naming_the_option(gpt2, hh_file):
    dm = PreferenceDataModule(tokenizer=gpt2, train_path=hh_file, hh_render="chat_template")
    with pytest.raises(ValueError, match=r"^hh_render: chat_template, but the tokenizer '.*' has no chat template"):
        dm.setup()
    with pytest.raises(ValueError, match=r"^hh_render must be one of auto, always, never; got 'chat'$"):
        PreferenceDataModule(tokenizer=gpt2, train_path=hh_file, hh_render="chat")


def log_lines(caplog, text):
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


def test_one_log_line_says_which_rendering_and_why(chat_tok, gpt2, hh_file, caplog):
    with caplog.at_level(logging.INFO, logger="rlhf_lit.data"):  # three HH sources, one line
        PreferenceDataModule(
            tokenizer=chat_tok, train_path=hh_file, val_path=hh_file, reference_path=hh_file, reference_format="hh_rlhf"
        ).setup()
    assert log_lines(caplog, "hh_rlhf transcripts") == [
        f"{hh_file}: hh_rlhf transcripts read as conversations and rendered with the tokenizer's chat template "
        f"(hh_render: auto, and the tokenizer {chat_tok.name_or_path!r} has a chat template)"
    ]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="rlhf_lit.data"):
        PromptDataModule(tokenizer=gpt2, train_path=hh_file).setup()
    assert log_lines(caplog, "hh_rlhf transcripts") == [
        f"{hh_file}: hh_rlhf transcripts kept as raw strings (split at the last '\\n\\nAssistant:') "
        f"(hh_render: auto, and the tokenizer {gpt2.name_or_path!r} has no chat template)"
    ]


def test_a_chat_rendering_is_recorded_for_the_resume_check_and_raw_is_not(chat_tok, gpt2, hh_file):
    chat = PreferenceDataModule(tokenizer=chat_tok, train_path=hh_file)
    assert "hh_render" not in chat.hparams
    chat.setup()
    assert chat.hparams["hh_render"] == "always"  # canonical (older checkpoints: chat_template, its alias)
    for dm in (
        PreferenceDataModule(tokenizer=gpt2, train_path=hh_file),
        PreferenceDataModule(tokenizer=chat_tok, train_path=hh_file, hh_render="raw"),
    ):
        dm.setup()
        assert "hh_render" not in dm.hparams  # as in checkpoints written before the option


def test_raw_on_a_chat_model_keeps_the_strings_and_warns_naming_the_option(chat_tok, hh_file, caplog):
    with caplog.at_level(logging.INFO, logger="rlhf_lit.data"):
        batch = one_batch(PromptDataModule(tokenizer=chat_tok, train_path=hh_file, hh_render="raw", batch_size=1))
    assert batch["input_ids"] == [[chat_tok.bos_token_id] + ids(chat_tok, RAW_PROMPT)]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"{hh_file}: the tokenizer {chat_tok.name_or_path!r} has a chat template, but the hh_rlhf transcripts are "
        "kept as raw strings (hh_render: never): the model is trained and sampled outside its template; set "
        "hh_render: auto (or always) to render them with it"
    ]


# --------------------------------------------------- other string prompts on a chat-template model
def test_string_prompts_a_chat_model_keeps_raw_warn_once_naming_chat_template(chat_tok, gpt2, tmp_path, caplog):
    path = write_jsonl(tmp_path / "pc.jsonl", [{"prompt": "Once", "completion": " upon"}] * 2)
    with caplog.at_level(logging.INFO, logger="rlhf_lit.data"):
        SFTDataModule(tokenizer=chat_tok, train_path=path, val_path=path, chat_template="never").setup()
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"{path}: the tokenizer {chat_tok.name_or_path!r} has a chat template, but the prompt_completion prompts are "
        "plain strings, kept outside the chat template (chat_template: never): the model is trained and sampled "
        "outside it; set chat_template: auto (or always) to render each as one user turn, or give conversational "
        "records (lists of messages)"
    ]
    for quiet in (
        SFTDataModule(tokenizer=chat_tok, train_path=path),
        SFTDataModule(tokenizer=chat_tok, train_path=path, chat_template="always"),
        SFTDataModule(tokenizer=gpt2, train_path=path),
    ):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="rlhf_lit.data"):
            quiet.setup()
        assert not [r for r in caplog.records if r.levelno == logging.WARNING]


def test_language_modelling_text_on_a_chat_model_points_to_conversational_records(chat_tok, tmp_path, caplog):
    path = write_jsonl(tmp_path / "text.jsonl", [{"text": "Once upon a time."}])
    with caplog.at_level(logging.INFO, logger="rlhf_lit.data"):
        SFTDataModule(tokenizer=chat_tok, train_path=path).setup()
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"{path}: the tokenizer {chat_tok.name_or_path!r} has a chat template, but format text gives plain strings, "
        "which are not rendered with the chat template (language modelling has no turns); to train inside the "
        "template, give conversational records (messages)"
    ]
