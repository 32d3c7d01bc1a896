"""Sweeps: a grid of questions answered by any number of workers sharing one storage.

:mod:`~parsearch.sweep.grid` (the axes and cells), :mod:`~parsearch.sweep.cells`
(answering one cell), :mod:`~parsearch.sweep.queue` (the cells as a work
queue in an optuna RDB storage: claim, heartbeat, retry), :mod:`~parsearch.sweep.worker`
(the loop of one worker) and :mod:`~parsearch.sweep.report` (table and plots).
"""

from parsearch.sweep.grid import Cell, SweepGrid, grid_from, load_grid_file

__all__ = ["Cell", "SweepGrid", "grid_from", "load_grid_file"]
