"""The built-in web pages for reading what went wrong, and the miss-cause API they use.

``routes.router`` carries both: the pages under /ui (``pages``) and the JSON routes under /v1
(``api``). ``queries`` holds the pages' database reads (and the miss-cause writes), ``filters``
reads the query string, ``views`` shapes rows for the templates, ``render`` and ``charts`` draw
them, ``auth`` says who is reading (a key or the login cookie).

The labelling queue (``label_page``) shows the analysis's figures of the labelled sample.

May import: ``service.store``, ``service.measures``, ``service.telemetry``, ``service.analysis``
and the API's shared parts (``service.api.deps``, ``service.api.state``, ``service.api.auth``,
``service.api.keys``).
This file imports nothing, so ``service.api.deps`` can take the UI's key checks from ``auth``.
"""
