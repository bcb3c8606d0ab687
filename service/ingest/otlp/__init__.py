"""OpenTelemetry ingest: OTLP/HTTP trace requests in, retrieval events out.

``decode`` turns a request body (protobuf or OTLP/JSON) into plain spans, converting only the spans
that carry an instrumentation kind attribute; ``mapping`` turns retriever and reranker spans into
event dicts for the ordinary validation and ingest; ``rules`` resolves app, retriever, environment
and k from attributes; ``responses`` writes OTLP's success and error bodies.
"""
