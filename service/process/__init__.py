"""Process supervision: the HTTP server (one API process or several on one port), the embedded
Redis, the worker subprocess, the structured logs and their tee, the guard that stops ``serve``'s
children when it dies, and the demo's workload.

May import any room of ``service`` but the command line (``service.cli``); never ``workers``
(the worker runs as a subprocess, started by its command line).
"""
