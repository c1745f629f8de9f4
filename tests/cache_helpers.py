"""What the cache_frozen tests of several stages share."""

from __future__ import annotations


def statistics_per_epoch(module) -> list[dict[str, float]]:
    """The frozen-trunk cache's counts at each epoch's end of ``module``'s fit (read before fit's end
    takes the hooks off and empties the store)."""
    seen: list[dict[str, float]] = []
    caches = module.trunk_caches
    module.on_train_epoch_end = lambda: seen.append(caches.statistics())
    return seen
