"""rlhf-lit: InstructGPT-style RLHF on PyTorch Lightning."""
