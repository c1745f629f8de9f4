"""The demo lives beside the package (``demo/`` at the checkout's root, run as ``python -m demo ...``),
not in it: its tests import it from the checkout, and the demo commands they start as subprocesses
find it through ``PYTHONPATH`` from any working folder."""

import os
import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
if ROOT not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
