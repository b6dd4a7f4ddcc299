"""The deterministic simulator: the real product code on one seeded loop with virtual time."""
