"""rlhf_lit.data imports no stage, model or CLI code, and `datasets` only for hub names."""

import subprocess
import sys

from suite_env import subprocess_env

CODE = """
import sys
import rlhf_lit.data
bad = sorted(m for m in sys.modules
             if m.startswith(('rlhf_lit.stages', 'rlhf_lit.models', 'rlhf_lit.cli', 'rlhf_lit.callbacks'))
             or m.split('.')[0] == 'datasets')
print(bad)
"""


def test_data_imports_one_way():
    out = subprocess.run(
        [sys.executable, "-c", CODE], capture_output=True, text=True, check=True, timeout=120, env=subprocess_env()
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
