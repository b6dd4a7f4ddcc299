"""Benchmarks (never tests): the on-disk engine against a raw write+fsync loop, CRC-32 options."""
