"""Suite-wide test settings."""

import os

# One thread per process: two threads on 2 cores under load were measured 10-50x slower.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

torch.set_num_threads(1)
