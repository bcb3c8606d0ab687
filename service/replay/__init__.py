"""Traffic sent again: BEIR-format datasets replayed through a small BM25 retriever as live
retrieval events (sent through the client library, ``retrieval_monitor_client``, as an
application would send them), the synthetic workload of the demo, and ``rejudge`` (stored
events judged again with another judge or prompt version).

May import: ``service.primitives``, ``service.config``, ``service.contract``, ``service.queue``,
``service.store``, ``service.spend``, ``service.analysis``, ``service.wiring`` and
``service.ingest`` (the judge queue).
"""
