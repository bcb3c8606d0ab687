"""Replay of BEIR-format datasets through a small BM25 retriever as live retrieval events."""
