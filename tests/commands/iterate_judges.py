"""A judge for the ``rlhf-lit iterate`` tests, importable without the test's own imports (the console-script
test runs the loop in a subprocess with this folder on ``PYTHONPATH``)."""


def length_judge(texts):
    """Deterministic: longer is better (the tiny policy's responses differ in length)."""
    return [float(len(t)) for t in texts]
