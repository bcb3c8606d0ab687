"""Real instrumented RAG clients exporting over OTLP/HTTP to the running service, judged end to end.

LangChain (``langchain-core`` + ``openinference-instrumentation-langchain``) and LlamaIndex
(``llama-index-core`` + ``openinference-instrumentation-llama-index``) run offline with in-memory
retrievers (a fake deterministic embedding, a keyword scorer) and LlamaIndex's MockLLM. The
OpenTelemetry SDK's own OTLP/HTTP exporter (protobuf, gzip) sends the spans to the app served over
HTTP; a real Celery worker asks the OpenAI-compatible test server to judge; the test reads the
grades and measures back from the API. An in-memory exporter beside the real one tells the test
which spans were sent, and so which event ids to expect.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from service.api import otlp
from service.store.migrate import upgrade
from tests.support.environment import make_settings
from tests.support.fake_llm.fixture import FakeLLM
from tests.support.live import LiveServer, WorkerFactory, wait_for

pytestmark = pytest.mark.slow

QUERY = "boiling point of water"
DOCS = {
    "d1": "water boils at 100 degrees celsius at sea level",
    "d2": "ice melts at zero degrees",
    "d3": "the boiling point of water drops at altitude",
    "d4": "bread is baked in ovens",
}
GRADES = {"d1": 3, "d2": 0, "d3": 2, "d4": 0}


@pytest.fixture
def service(
    tmp_path: Path,
    sqlite_url: str,
    redis_url: str,
    fake_llm: FakeLLM,
    worker_factory: WorkerFactory,
) -> Iterator[LiveServer]:
    upgrade(sqlite_url)
    settings = make_settings(
        tmp_path,
        sqlite_url,
        redis_url,
        judge_base_url=fake_llm.base_url,
        judge_model="fake-judge",
        judge_timeout_seconds=5,
    )
    fake_llm.set_labels({(QUERY, DOCS[d]): g for d, g in GRADES.items()}, default_grade=0)
    worker_factory(settings).start()
    server = LiveServer(settings)
    app = served_app(server)
    if not any(getattr(route, "path", None) == "/v1/traces" for route in app.routes):
        app.include_router(otlp.router)
    with server:
        yield server


def served_app(server: LiveServer) -> FastAPI:
    app = server.server.config.app
    assert isinstance(app, FastAPI)
    return app


@contextmanager
def exporting_to(server: LiveServer, service_name: str) -> Iterator[tuple[Any, Any, Any]]:
    """A tracer provider sending to the service, plus an in-memory copy of every span."""
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    resource = Resource.create(
        {"service.name": service_name, "deployment.environment.name": "test"}
    )
    provider = TracerProvider(resource=resource)
    exporter = OTLPSpanExporter(
        endpoint=f"{server.url}/v1/traces", compression=Compression.Gzip, timeout=10
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    try:
        yield provider, exporter, memory
    finally:
        provider.shutdown()


def event_id_of(span: Any) -> str:
    context = span.get_span_context()
    return f"otel:{context.trace_id:032x}:{context.span_id:016x}"


def retriever_spans(memory: Any, kind: str = "RETRIEVER") -> list[Any]:
    return [
        s
        for s in memory.get_finished_spans()
        if s.attributes.get("openinference.span.kind") == kind
        and any(".document.content" in key for key in s.attributes)
    ]


def counter(server: LiveServer, name: str) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    )


def judged(server: LiveServer, event_id: str) -> dict[str, Any]:
    url = f"{server.url}/v1/events/{event_id}"

    def done() -> bool:
        response = httpx.get(url, timeout=10)
        return response.status_code == 200 and response.json()["status"] == "judged"

    wait_for(done, timeout=30)
    body: dict[str, Any] = httpx.get(url, timeout=10).json()
    return body


def check_judged(event: Mapping[str, Any], ids: Sequence[str], k: int) -> None:
    """Grades are the labels of the passages sent; the measures follow from them."""
    assert [p["id"] for p in event["passages"]] == list(ids)
    assert [p["grade"] for p in event["passages"]] == [GRADES[i] for i in ids]
    assert event["k"] == k
    relevant = [GRADES[i] >= 2 for i in ids[:k]]
    measures = event["measures"]
    assert measures["precision"] == pytest.approx(sum(relevant) / k)
    assert measures["hit"] == float(any(relevant))
    first = next((rank for rank, hit in enumerate(relevant, start=1) if hit), None)
    assert measures["rr"] == pytest.approx(1 / first if first else 0.0)


def stored_candidates(server: LiveServer, event_id: str) -> list[dict[str, Any]]:
    """The first-stage list as stored (the event view does not show it)."""
    import json

    from sqlalchemy import create_engine, text

    engine = create_engine(served_app(server).state.rm.runtime.settings.database_url)
    with engine.connect() as conn:
        (raw,) = conn.execute(
            text("SELECT candidates FROM events WHERE event_id = :id"), {"id": event_id}
        ).one()
    engine.dispose()
    candidates: list[dict[str, Any]] = json.loads(raw) if isinstance(raw, str) else raw
    return candidates


def run_instrumented(instrumentor: Any, provider: Any, work: Callable[[], None]) -> None:
    instrumentor.instrument(tracer_provider=provider)
    try:
        work()
    finally:
        instrumentor.uninstrument()
    assert provider.force_flush(timeout_millis=15_000)


def test_langchain_retrievers_export_and_are_judged(service: LiveServer) -> None:
    pytest.importorskip("langchain_core", reason="test dependency langchain-core not installed")
    pytest.importorskip(
        "openinference.instrumentation.langchain",
        reason="test dependency openinference-instrumentation-langchain not installed",
    )
    from langchain_core.callbacks import CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.embeddings import DeterministicFakeEmbedding
    from langchain_core.retrievers import BaseRetriever
    from langchain_core.vectorstores import InMemoryVectorStore
    from openinference.instrumentation.langchain import LangChainInstrumentor

    class KeywordRetriever(BaseRetriever):
        """Ranks by shared words; the score goes in the metadata, as many retrievers do."""

        def _get_relevant_documents(
            self, query: str, *, run_manager: CallbackManagerForRetrieverRun
        ) -> list[Document]:
            words = set(query.split())
            ranked = sorted(DOCS, key=lambda d: (-len(words & set(DOCS[d].split())), d))
            return [
                Document(
                    id=d,
                    page_content=DOCS[d],
                    metadata={"score": float(len(words & set(DOCS[d].split())))},
                )
                for d in ranked[:3]
            ]

    store = InMemoryVectorStore(DeterministicFakeEmbedding(size=32))
    store.add_texts(list(DOCS.values()), ids=list(DOCS))
    returned: dict[str, list[str]] = {}

    def work() -> None:
        vector = store.as_retriever(search_kwargs={"k": 3}).invoke(QUERY)
        keyword = KeywordRetriever().invoke(QUERY, config={"metadata": {"retrieval_monitor.k": 2}})
        returned["vectorstore"] = [str(doc.id) for doc in vector]
        returned["keyword"] = [str(doc.id) for doc in keyword]

    with exporting_to(service, "lc-support-bot") as (provider, exporter, memory):
        run_instrumented(LangChainInstrumentor(), provider, work)
        spans = {s.name: s for s in retriever_spans(memory)}
        assert set(spans) == {"VectorStoreRetriever", "KeywordRetriever"}

        vector_event = judged(service, event_id_of(spans["VectorStoreRetriever"]))
        assert (vector_event["app"], vector_event["retriever"]) == ("lc-support-bot", "vectorstore")
        assert vector_event["environment"] == "test"
        assert vector_event["query"] == QUERY
        check_judged(vector_event, returned["vectorstore"], k=3)

        keyword_event = judged(service, event_id_of(spans["KeywordRetriever"]))
        assert keyword_event["retriever"] == "keyword"
        check_judged(keyword_event, returned["keyword"], k=2)  # k from the run's metadata

        # The exporter sending the same spans again (a retry) stores nothing new.
        assert counter(service, "retrieval_monitor_events_accepted_total") == 2
        from opentelemetry.sdk.trace.export import SpanExportResult

        assert exporter.export(memory.get_finished_spans()) == SpanExportResult.SUCCESS
        assert counter(service, "retrieval_monitor_events_accepted_total") == 2
        assert counter(service, "retrieval_monitor_events_duplicate_total") == 2


def test_llama_index_query_engine_exports_retriever_and_reranker(service: LiveServer) -> None:
    pytest.importorskip("llama_index.core", reason="test dependency llama-index-core missing")
    pytest.importorskip(
        "openinference.instrumentation.llama_index",
        reason="test dependency openinference-instrumentation-llama-index not installed",
    )
    from llama_index.core.instrumentation.events.rerank import ReRankEndEvent, ReRankStartEvent
    from llama_index.core.llms import MockLLM
    from llama_index.core.postprocessor.types import BaseNodePostprocessor
    from llama_index.core.query_engine import RetrieverQueryEngine
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
    from llama_index_instrumentation import get_dispatcher
    from openinference.instrumentation import using_metadata
    from openinference.instrumentation.llama_index import LlamaIndexInstrumentor

    dispatcher = get_dispatcher(__name__)

    class KeywordRetriever(BaseRetriever):
        def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
            words = set(query_bundle.query_str.split())
            overlap = {d: len(words & set(text.split())) for d, text in DOCS.items()}
            ranked = sorted(DOCS, key=lambda d: (-overlap[d], d))[:3]
            return [
                NodeWithScore(node=TextNode(id_=d, text=DOCS[d]), score=float(overlap[d]))
                for d in ranked
            ]

    class ShortestFirstReranker(BaseNodePostprocessor):
        """Keeps the two shortest passages, announcing itself as a reranker does."""

        top_n: int = 2

        def _postprocess_nodes(
            self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
        ) -> list[NodeWithScore]:
            dispatcher.event(
                ReRankStartEvent(
                    query=query_bundle, nodes=nodes, top_n=self.top_n, model_name="shortest-first"
                )
            )
            ordered = sorted(nodes, key=lambda n: len(n.node.get_content()))[: self.top_n]
            kept = [NodeWithScore(node=n.node, score=-len(n.node.get_content())) for n in ordered]
            dispatcher.event(ReRankEndEvent(nodes=kept))
            return kept

    engine = RetrieverQueryEngine.from_args(
        KeywordRetriever(),
        llm=MockLLM(max_tokens=8),
        node_postprocessors=[ShortestFirstReranker()],
    )
    answer: dict[str, Any] = {}

    def work() -> None:
        # The prompt carries 2 passages: said through OpenInference's context metadata.
        with using_metadata({"retrieval_monitor.k": 2}):
            answer["response"] = engine.query(QUERY)

    with exporting_to(service, "li-support-bot") as (provider, _exporter, memory):
        run_instrumented(LlamaIndexInstrumentor(), provider, work)
        all_spans = memory.get_finished_spans()
        (retrieve,) = retriever_spans(memory)
        (rerank,) = retriever_spans(memory, "RERANKER")

        retrieved = judged(service, event_id_of(retrieve))
        assert (retrieved["app"], retrieved["retriever"]) == ("li-support-bot", "KeywordRetriever")
        first_stage = ["d3", "d1", "d2"]  # words shared with the query: 4, 1, 0 (d4 cut)
        check_judged(retrieved, first_stage, k=2)

        reranked = judged(service, event_id_of(rerank))
        assert reranked["retriever"] == "shortest-first"  # reranker.model_name
        source = answer["response"].source_nodes
        check_judged(reranked, [n.node.node_id for n in source], k=2)
        assert [c["id"] for c in stored_candidates(service, event_id_of(rerank))] == first_stage

        # Of every span of the query (engine, synthesizer, LLM, nested _retrieve...), only the
        # retriever and the reranker became events.
        assert len(all_spans) > 8
        assert counter(service, "retrieval_monitor_events_accepted_total") == 2
        assert counter(service, "retrieval_monitor_events_rejected_total") == 0
