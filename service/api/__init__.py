"""The HTTP layer: the FastAPI application, its routes (health and readiness in ``health``,
``/metrics`` in ``scrape``), the body limit and HTTP answer counting. What every route shares
(the application state, the dependencies declared once) is ``service.http``'s; who is calling is
``service.auth``'s.

May import any stage of ``service``; never ``workers`` (judge tasks are sent by name).
"""
