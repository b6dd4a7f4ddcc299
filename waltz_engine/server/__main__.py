"""``python -m waltz_engine.server --config server.yml``: run a server (``waltz server start``)."""

from waltz_engine.common.process import node_main
from waltz_engine.server.server import run

node_main("server", run)
