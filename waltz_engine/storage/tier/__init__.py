"""Tiered storage (our extension, issue 25): a storage node uploads its sealed, committed
segments to an object store (``storage.tier.url``), keeps a bounded local disk by removing the
oldest uploaded ones, and reads evicted ranges back into a bounded cache.

``settings`` holds the node's ``storage.tier.*`` keys; ``manifest`` the per-replica manifest
and object names; ``offload`` the node's background uploads and evictions; ``reads`` a
partition's evicted segments and their read-back cache. docs/operations.md explains the tier.
"""
