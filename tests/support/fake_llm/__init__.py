"""A stand-in for the LLM judge endpoint: a real OpenAI-compatible server run as a subprocess."""
