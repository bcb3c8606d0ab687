"""The built-in web pages for reading what went wrong, and the miss-cause API they use.

``routes.router`` carries both: the pages under /ui (``pages``) and the JSON routes under /v1
(``api``). ``filters`` reads the query string, ``views`` shapes rows for the templates, ``render``
and ``charts`` draw them; the pages' database reads (and the miss-cause writes) are the store's
(``service.store.pages``), and who is reading is the auth room's (``service.auth.browser``: a key
or the login cookie).

The labelling queue (``label_page``) shows the analysis's figures of the labelled sample.

May import: ``service.primitives``, ``service.config``, ``service.contract``, ``service.queue``,
``service.store``, ``service.measures``, ``service.telemetry``, ``service.analysis``,
``service.auth`` and ``service.http`` (the application state and the route dependencies). Never
``service.api`` (which mounts these routes) or ``workers``.
"""
