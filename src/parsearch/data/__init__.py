"""Data files shipped inside the parsearch package.

``published_runs.csv`` holds real training runs (layout and measured
throughput) transcribed from papers and NVIDIA performance tables; see
``PROVENANCE.md`` next to it for the sources and caveats, and
:mod:`parsearch.validation.published.published_runs` for the loader.  This module exists
only so that ``importlib.resources`` can find the files and the wheel ships them.
"""
