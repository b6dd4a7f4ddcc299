"""The storage node's ``storage.tier.*`` keys (our extension; off unless ``storage.tier.url``
is set)."""

from __future__ import annotations

from typing import NamedTuple

from waltz_engine.common.config import Config, ConfigError
from waltz_engine.common.extras import BACKUP, require
from waltz_engine.common.object_store import url_scheme_problem

KEY_TIER_URL = "storage.tier.url"
KEY_TIER_BYTES_PER_SECOND = "storage.tier.bytes.per.second"
KEY_TIER_LOCAL_BYTES = "storage.tier.local.bytes"
KEY_TIER_CACHE_BYTES = "storage.tier.cache.bytes"
KEY_TIER_CHECK_INTERVAL = "storage.tier.check.interval.ms"
TIER_KEYS = (
    KEY_TIER_URL,
    KEY_TIER_BYTES_PER_SECOND,
    KEY_TIER_LOCAL_BYTES,
    KEY_TIER_CACHE_BYTES,
    KEY_TIER_CHECK_INTERVAL,
)

# Uploads share this rate per node: a sealed 1 GB segment takes about a minute.
DEFAULT_TIER_BYTES_PER_SECOND = 16 * 1024 * 1024
# 0: every segment stays local (uploaded all the same: a copy off the machine).
DEFAULT_TIER_LOCAL_BYTES = 0
# Evicted segments read back, per partition; the segment being read stays even when larger.
DEFAULT_TIER_CACHE_BYTES = 1024 * 1024 * 1024
# How often the node looks for segments to upload and to evict.
DEFAULT_TIER_CHECK_INTERVAL_MS = 10_000


class TierSettings(NamedTuple):
    url: str
    bytes_per_second: int = DEFAULT_TIER_BYTES_PER_SECOND
    local_bytes: int = DEFAULT_TIER_LOCAL_BYTES
    cache_bytes: int = DEFAULT_TIER_CACHE_BYTES
    check_interval_ms: int = DEFAULT_TIER_CHECK_INTERVAL_MS


def read_tier_settings(config: Config) -> TierSettings | None:
    """The tier's keys, or None when ``storage.tier.url`` is not set (the other keys then do
    nothing). pyarrow must be installed when it is set: a one-line error says how."""
    url = config.optional_str(KEY_TIER_URL)
    if url is None:
        return None
    if not url.strip():
        raise ConfigError(f"{config.source}: key '{KEY_TIER_URL}' must not be empty")
    problem = url_scheme_problem(url.strip())
    if problem is not None:
        raise ConfigError(f"{config.source}: key '{KEY_TIER_URL}': {problem}")
    require(BACKUP, f"'{KEY_TIER_URL}'", "pyarrow")
    return TierSettings(
        url=url.strip(),
        bytes_per_second=config.get_positive(
            KEY_TIER_BYTES_PER_SECOND, DEFAULT_TIER_BYTES_PER_SECOND, long=True
        ),
        local_bytes=config.get_not_negative(KEY_TIER_LOCAL_BYTES, DEFAULT_TIER_LOCAL_BYTES, long=True),
        cache_bytes=config.get_positive(KEY_TIER_CACHE_BYTES, DEFAULT_TIER_CACHE_BYTES, long=True),
        check_interval_ms=config.get_positive(
            KEY_TIER_CHECK_INTERVAL, DEFAULT_TIER_CHECK_INTERVAL_MS, long=True
        ),
    )
