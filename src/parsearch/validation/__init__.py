"""How far to trust the cost model, and how to make it fit a cluster: four jobs, four rooms.

Each subpackage imports only from the ones above it in this list (and from the
packages below ``validation``); ``tests/test_import_layers.py`` checks it.

* :mod:`~parsearch.validation.published`: the bundled published runs (reading the
  CSV, each source's conventions, models, layouts, recipes and corrections), scoring
  them against predictions (:mod:`~parsearch.validation.published.runs`) and where the
  published layouts land in the search (:mod:`~parsearch.validation.published.ranking`);
* :mod:`~parsearch.validation.fit`: the shipped fit, residual factors fitted to measured
  runs inside cited ranges (:mod:`~parsearch.validation.fit.calibration`, factor ties,
  joint profile and cluster factors, the cluster speed factor, the GEMM size curve)
  and its out-of-sample accuracy (:mod:`~parsearch.validation.fit.crossval`);
* :mod:`~parsearch.validation.user`: the user's own measurements (tables and Megatron
  logs) and ``parsearch calibrate`` on them, with its report;
* :mod:`~parsearch.validation.planning`: ``parsearch plan-profiling``, which runs to
  measure next and how to launch them.
"""
