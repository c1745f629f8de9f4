"""rlhf-lit: InstructGPT-style RLHF on PyTorch Lightning."""

__version__ = "0.2.0"
"""The one version string: pyproject.toml reads it, ``rlhf-lit --version`` prints it, CHANGELOG.md names it."""
