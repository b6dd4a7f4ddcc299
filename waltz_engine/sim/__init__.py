"""The deterministic simulator (issue 21): the real code of clients, servers and storage nodes
in one process, on one seeded scheduler with virtual time.

``loop``: :class:`~waltz_engine.sim.loop.SimLoop`, the asyncio loop with virtual time, inline
executors and the run's trace; ``network``: :class:`~waltz_engine.sim.network.SimNetwork`, the
in-memory network with its faults, behind :class:`waltz_engine.net.transport.Network`;
``zk_model``: :class:`~waltz_engine.sim.zk_model.SimZooKeeper`, ZooKeeper in memory (sessions,
versions, watches, an outage), reached through the product's ZooKeeper connector; ``world``:
a cluster of real storage nodes, a server and a client on them, its workload and checks (one
seed); ``runner``: many seeds (``waltz sim``).
"""
