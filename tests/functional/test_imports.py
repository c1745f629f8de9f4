"""rlhf_lit.functional must stay pure torch: no lightning, transformers or other rlhf_lit modules."""

import subprocess
import sys

from suite_env import subprocess_env

CODE = """
import sys
import rlhf_lit.functional
heavy = sorted(m for m in sys.modules
               if m.split('.')[0] in ('lightning', 'pytorch_lightning', 'lightning_fabric', 'transformers'))
ours = sorted(m for m in sys.modules
              if m.startswith('rlhf_lit.') and not m.startswith('rlhf_lit.functional'))
print(heavy, ours)
"""


def test_functional_imports_torch_only():
    out = subprocess.run(
        [sys.executable, "-c", CODE], capture_output=True, text=True, check=True, timeout=120, env=subprocess_env()
    )
    assert out.stdout.strip() == "[] []", out.stdout + out.stderr
