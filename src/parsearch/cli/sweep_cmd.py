"""``parsearch sweep``: a grid of questions answered by workers sharing one storage."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from parsearch.cli.common import (
    choice_list,
    int_list,
    non_negative_int,
    positive_int,
    print_json,
    print_table,
)
from parsearch.cli.signals import sigterm_as_interrupt
from parsearch.errors import SpecError
from parsearch.model.specs import PRECISIONS, RECOMPUTE_MODES

#: Longest heartbeat interval or hold, in seconds.
MAX_WAIT_S = 3600


def _names(text: str) -> tuple[str, ...]:
    values = tuple(p.strip() for p in text.split(",") if p.strip())
    if not values:
        raise argparse.ArgumentTypeError("give at least one name, e.g. llama3-8b,llama3-70b")
    return values


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "sweep", help="a grid of questions, shared by any number of workers",
        description="Answer every cell of a grid (models x clusters x GPU counts x global "
        "batches x sequence lengths: the best layout of that model on exactly that many GPUs) "
        "as one resumable job kept in a database.  Start the same command on several "
        "machines (or add --worker to a command naming only --storage) and they share the "
        "cells: each cell is answered once, and a cell whose worker dies is picked up by "
        "another.  Without --worker the command prints the report of the whole grid when "
        "every cell is done (exit 1 if some cell could not be answered after retries).")
    grid = parser.add_argument_group("grid (a list given here replaces the grid file's)")
    grid.add_argument("--grid", metavar="FILE", default=None,
                      help="grid file (.yaml, .toml or .json) with models, clusters, gpus, "
                      "global_batch, seq_len and optionally micro_batch_sizes, recompute, "
                      "precision, top")
    grid.add_argument("--models", type=_names, default=None, metavar="LIST",
                      help="model presets or files, comma-separated")
    grid.add_argument("--clusters", type=_names, default=None, metavar="LIST",
                      help="cluster presets or files, comma-separated")
    grid.add_argument("--gpus", type=int_list, default=None, metavar="LIST",
                      help="GPU counts, e.g. 64,128,256")
    grid.add_argument("--global-batch", type=int_list, default=None, metavar="LIST",
                      help="global batch sizes in sequences")
    grid.add_argument("--seq-len", type=int_list, default=None, metavar="LIST",
                      help="sequence lengths in tokens")
    grid.add_argument("--micro-batch-sizes", type=int_list, default=None, metavar="LIST",
                      help="micro-batch candidates of every cell (default 1,2,4,8)")
    grid.add_argument("--recompute", type=choice_list(RECOMPUTE_MODES), default=None,
                      metavar="LIST", help="recompute candidates (default all)")
    grid.add_argument("--precision", choices=PRECISIONS, default=None,
                      help="GEMM precision of every cell (default bf16)")
    grid.add_argument("--top", type=positive_int, default=None, metavar="K",
                      help="layouts kept per cell (default 1)")
    job = parser.add_argument_group("job")
    job.add_argument("--storage", default=None, metavar="URL",
                     help="where the sweep lives: sqlite:///FILE (default "
                     "sqlite:///parsearch-sweep.db, one machine) or postgresql://user@host/db "
                     "(several machines; needs pip install \"parsearch[postgres]\")")
    job.add_argument("--name", default=None, metavar="NAME",
                     help="sweep name (default: derived from the grid; without a grid, the "
                     "only sweep in the storage)")
    mode = job.add_mutually_exclusive_group()
    mode.add_argument("--worker", action="store_true",
                      help="answer cells until the sweep is done, then exit without the report")
    mode.add_argument("--report-only", action="store_true",
                      help="print the report of what is done so far; answer no cell")
    job.add_argument("--heartbeat", type=positive_int, default=None, metavar="S",
                     help="seconds between a worker's heartbeats (default 10); a cell whose "
                     "worker misses 6 of them is queued again")
    job.add_argument("--db-retry-seconds", type=non_negative_int, default=None, metavar="S",
                     help="how long a worker waits for its database when it cannot be "
                     "reached (a restart, a failover) before it gives up (default 300; 0: "
                     "give up at once); it says so on stderr, and resumes when it is back")
    job.add_argument("--hold", type=float, default=0.0, help=argparse.SUPPRESS)
    job.add_argument("--max-cells", type=positive_int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--format", choices=("table", "json", "csv"), default="table",
                        help="report format (default table)")
    parser.add_argument("--plot", default=None, metavar="FILE",
                        help="draw tokens/s against GPUs of every cell to FILE (.png, .svg, "
                        ".pdf)")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="cells done on stderr (default: only when stderr is a terminal)")
    parser.set_defaults(handler=run_sweep)


def _grid(args: argparse.Namespace) -> Any:
    from parsearch.sweep.grid import grid_from, load_grid_file

    overrides = {"models": args.models, "clusters": args.clusters, "gpus": args.gpus,
                 "global_batch": args.global_batch, "seq_len": args.seq_len,
                 "micro_batch_sizes": args.micro_batch_sizes, "recompute": args.recompute,
                 "precision": args.precision, "top": args.top}
    document = load_grid_file(args.grid) if args.grid else {}
    if not document and all(v is None for v in overrides.values()):
        return None  # join the sweep already in the storage
    return grid_from(document, overrides, where=f"--grid {args.grid!r}" if args.grid
                     else "sweep grid")


def run_sweep(args: argparse.Namespace) -> int:
    from parsearch.sweep.outage import DatabaseOutageError

    try:
        return _run_sweep(args)
    except DatabaseOutageError as error:  # not bad input: the database stayed away
        print(f"parsearch sweep: error: {error}", file=sys.stderr)
        return 3


def _run_sweep(args: argparse.Namespace) -> int:
    from parsearch.search.storage import DEFAULT_HEARTBEAT_S, redact
    from parsearch.sweep.cells import CellSolver
    from parsearch.sweep.outage import DEFAULT_RETRY_S, MAX_RETRY_S, Retrier
    from parsearch.sweep.queue import DEFAULT_STORAGE, CellQueue
    from parsearch.sweep.report import build_report, check_plot_path, summary_line
    from parsearch.sweep.worker import run_worker, worker_name

    if not 0 <= args.hold <= MAX_WAIT_S:
        raise SpecError(f"--hold {args.hold} must be between 0 and {MAX_WAIT_S} seconds")
    if args.heartbeat is not None and args.heartbeat > MAX_WAIT_S:
        raise SpecError(f"--heartbeat {args.heartbeat} must be at most {MAX_WAIT_S} seconds")
    retry_s = DEFAULT_RETRY_S if args.db_retry_seconds is None else args.db_retry_seconds
    if retry_s > MAX_RETRY_S:
        raise SpecError(f"--db-retry-seconds {retry_s} must be at most {MAX_RETRY_S} seconds "
                        "(a week)")
    if args.plot is not None:
        if args.worker:
            raise SpecError("--plot draws the report; a --worker prints none (drop one)")
        check_plot_path(args.plot)
    grid = _grid(args)
    if grid is not None and not args.report_only:
        CellSolver(grid).check()  # a misspelt model or cluster fails before the sweep is stored
    url = args.storage or DEFAULT_STORAGE
    start = time.monotonic()
    queue = CellQueue.open(url, grid=grid, name=args.name,
                           heartbeat_s=args.heartbeat or DEFAULT_HEARTBEAT_S)
    db = Retrier(url, retry_s)
    answered: list[int] = []
    if not args.report_only:
        solver = CellSolver(queue.grid)
        solver.check()
        name = worker_name(db.call("number this worker", queue.worker_number))
        show = sys.stderr.isatty() if args.progress is None else bool(args.progress)

        def progress(p: Any) -> None:
            if show:
                print(f"\rsweep {queue.name}: {p.done}/{p.cells} cells done, {p.running} "
                      "running", end="", file=sys.stderr, flush=True)

        try:
            with sigterm_as_interrupt():
                stats = run_worker(queue, solver, name=name, hold_s=args.hold,
                                   max_cells=args.max_cells, on_progress=progress, db=db)
        except KeyboardInterrupt:
            print(f"\nparsearch sweep: interrupted; the cell in hand went back to the queue in "
                  f"{redact(url)}; rerun to continue", file=sys.stderr)
            raise
        if show:
            print(file=sys.stderr)
        answered = stats.cells
    report = db.call("read the report", lambda: build_report(queue))
    line = summary_line(report, time.monotonic() - start, answered)
    if args.worker:
        print(line, file=sys.stderr)
        return 0
    _print_report(report, args.format)
    if args.plot is not None:
        from parsearch.sweep.report import write_plot

        write_plot(report, args.plot)
        print(f"plot written to {args.plot}", file=sys.stderr)
    print(line, file=sys.stderr)
    return 1 if report.progress.failed else 0


def _print_report(report: Any, fmt: str) -> None:
    from parsearch.sweep.report import csv_text, table_rows

    if fmt == "json":
        print_json(report.to_dict())
    elif fmt == "csv":
        sys.stdout.write(csv_text(report))
    else:
        headers, rows = table_rows(report)
        print_table(headers, rows)
