"""What the server adapters (``sglang``, the ``vllm`` server variant) share: launching or attaching a
server process (:mod:`.process`), the HTTP client (:mod:`.http`) and the Prometheus metrics parser
(:mod:`.metrics`).  Imports only :mod:`april_bench.engines.protocol`; no engine imports another's module."""
