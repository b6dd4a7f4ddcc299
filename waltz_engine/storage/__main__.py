"""``python -m waltz_engine.storage --config storage.yml``: run a storage node (``waltz storage start``)."""

from waltz_engine.common.process import node_main
from waltz_engine.storage.node import run

node_main("storage", run)
