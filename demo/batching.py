"""Moved: :func:`rlhf_lit.models.generation.sample_batches` (prompt strings in left-padded, seeded batches).

The demo's evaluation, preference labelling and the ``rlhf-lit evaluate`` / ``best-of-n`` commands
share it; this name stays for the demo's imports.
"""

from rlhf_lit.models.generation import sample_batches

__all__ = ["sample_batches"]
