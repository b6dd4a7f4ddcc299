"""`waltz smoke`: the original's smoke test (reference §5.2) with real processes.

``schedule`` draws a seeded fault schedule, ``workload`` is the client process, ``checks``
holds the six correctness checks as pure functions, ``cluster`` and ``proxy`` put TCP proxies
in front of every server and storage node, ``runner`` ties them together.
"""
