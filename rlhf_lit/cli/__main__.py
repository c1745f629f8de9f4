"""``python -m rlhf_lit.cli``: the `rlhf-lit` command (what the demo and the tests launch)."""

from rlhf_lit.cli import main

if __name__ == "__main__":
    main()
