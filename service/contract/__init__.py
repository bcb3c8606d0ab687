"""The v1 wire contract in one room: the schemas, the batch decoder, the counted JSON shape, the
count limits, the validation errors, the storable checks, the client-text mask and redaction,
the answers an ASGI guard sends, and the two steps that turn a body into an event or a refusal
(``validate``, then ``redact``).

May import: ``service.primitives`` and ``service.config``. Everything above may import it.
"""
