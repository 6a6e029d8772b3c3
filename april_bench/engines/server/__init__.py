"""What the server adapters (``sglang``, the ``vllm`` server variant) share: launching or attaching a
server process (:mod:`.process`), the HTTP client (:mod:`.http`), the Prometheus metrics parser
(:mod:`.metrics`), the health probe (:mod:`.health`), and the adapter base that holds the server's
address, the client between ``start`` and ``close`` and ``health`` (:mod:`.adapter`).  Imports only
:mod:`april_bench.engines.protocol`; no engine imports another's module."""
