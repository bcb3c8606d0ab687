"""Analysis of stored traffic: which measure predicts answer quality (the paper's method), what
gold traffic says about the retrieval ceiling and the conversion rate (the article's arithmetic),
whether a change is real at the sample size, and how far the judge agrees with the gold labels;
and the local judge's thresholds fitted on a tenant's gold traffic (``local_calibration``).

Everything numeric is pure (arrays in, dataclasses out); ``service.store.analysis`` reads
the database and ``runner`` ties the two together for the API and the command line.

May import: ``service.primitives``, ``service.config``, ``service.store`` and ``service.measures``.
"""
