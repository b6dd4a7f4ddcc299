"""Networking (the original's riff library, reference §0.1).

``channel``: framed TLS connections with the Hello handshake and keep-alives, for every port;
``tls``: TLS contexts from the original's ``ssl.*`` keys (JKS, PKCS12, PEM); ``http_endpoints``:
the nodes' HTTP health and metrics endpoints (§1.8, §2.9); ``tcp_proxy``: a fault-injecting
TCP proxy for tests and the smoke test.
"""
