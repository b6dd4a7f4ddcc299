"""Benchmarks behind ``waltz bench`` (never tests; figures go to docs/benchmarks.md): the on-disk
engine against a raw write+fsync loop (``engine_bench``), CRC-32 options (``crc_bench``), a
storage node (``storage_node``), producers and consumers in the original's shape
(``producers``, ``consumers``), and ``compare`` for two saved reports."""
