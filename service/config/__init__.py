"""The configuration: every setting, read from the environment (``RM_*``) and checked at start.

May import: ``service.primitives``. Everything else may import it.
"""
