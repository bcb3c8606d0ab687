"""The HTTP layer: the FastAPI application, its routes, and what every route shares (the
application state, the dependencies declared once in ``deps``, the caller's identity and API
keys, the body limit, HTTP answer counting).

May import any stage of ``service``; never ``workers`` (judge tasks are sent by name).
"""
