"""The server (the original's ``waltz-server``, reference §2): it gives each append a dense
transaction id, replicates it through the store layer (``store/``, §2.7) and feeds committed
transactions to clients.

``server`` (the process: cluster membership, partitions, §2.1-§2.3), ``handler`` (client
messages, §2.4), ``partition`` (one partition's append and feed tasks, §2.5), ``locks`` (the
lock table, §2.6), ``feeds``, ``feed_cache`` and ``transaction_cache`` (what is sent to
clients), ``rpc_client`` (the tools' RPC client) and ``config``.
"""
