"""The bundled published training runs: reading them, and predictions against them.

Reading a row: :mod:`.run_cells` (cells), :mod:`.run_conventions` (each source's
throughput convention), :mod:`.run_models`, :mod:`.run_layouts`, :mod:`.recipes` (what
each run turned on) and :mod:`.run_corrections`; :mod:`.published_runs` loads the CSV.
:mod:`.runs` scores every run and compares; :mod:`.ranking` ranks the published
layouts in the search's list.
"""
