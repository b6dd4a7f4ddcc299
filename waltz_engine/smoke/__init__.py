"""`waltz smoke`: the original's smoke test (reference §5.2) with real processes.

``schedule`` draws a seeded fault schedule, ``workload`` is the client process, ``checks``
holds the correctness checks as pure functions, ``cluster`` puts TCP proxies
(``waltz_engine.net.tcp_proxy``) in front of every server and storage node, ``clients`` starts
the client processes, ``report`` renders the result and ``runner`` ties them together.
"""
