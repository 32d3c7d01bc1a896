"""plan-profiling bound to the layouts a user can run (``--candidates FILE``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parsearch.cli import main
from parsearch.cost.analytic import build_cost_model
from parsearch.errors import SpecError
from parsearch.layout.space import enumerate_layouts
from parsearch.model.presets import get_preset
from parsearch.model.specs import TrainingSpec
from parsearch.search.exhaustive import rank_feasible, scan_table
from parsearch.topology.cluster import load_cluster
from parsearch.topology.fabric import build_fabric
from parsearch.validation.planning.plan_profiling import plan_profiling
from parsearch.validation.planning.runnable import RunnableLayouts, read_runnable_layouts
from tests.cli_helpers import error_reading

MODEL = get_preset("llama3-8b")
TRAINING = TrainingSpec(seq_len=4096, global_batch=64, micro_batch_sizes=(1, 2))
GPUS = 16
CM = build_cost_model(MODEL, TRAINING, build_fabric(load_cluster("dgx-h100"), GPUS))
TABLE = enumerate_layouts(MODEL, TRAINING, GPUS)
SCAN = scan_table(CM, TABLE)
#: the 40 best feasible layouts, the pool the user's runnable lists are drawn from
POOL = [TABLE.layout(int(SCAN.feasible_rows[i])) for i in rank_feasible(SCAN, top=40)]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(0, len(POOL) - 1), min_size=2, max_size=12, unique=True),
       st.integers(1, 3))
def test_plan_picks_only_runnable_layouts(indices: list[int], k: int) -> None:
    runnable = RunnableLayouts("test", tuple(POOL[i] for i in indices))
    plan = plan_profiling(CM, k=k, runnable=runnable)
    assert plan.picks and len(plan.picks) <= k
    for pick in plan.picks:
        assert pick.layout in runnable.layouts
    assert plan.not_valid == ()


def test_file_forms_comments_and_duplicates(tmp_path: Path) -> None:
    first, second = POOL[0], POOL[1]
    path = tmp_path / "runnable.txt"
    path.write_text(f"# ours\n{first.key()}\n\n"
                    f"tp={second.tp},pp={second.pp},cp={second.cp},ep={second.ep},"
                    f"etp={second.etp},vpp={second.vpp},mbs={second.mbs},"
                    f"sp={str(second.sp).lower()},recompute={second.recompute}  # note\n"
                    f"{first.key()}\n", encoding="utf-8")
    assert read_runnable_layouts(path, GPUS).layouts == (first, second)


@pytest.mark.parametrize(("text", "fragment"), [
    ("tp=8,pp=x\n", "line 1"),
    ("# nothing\n\n", "no layout in the file"),
    ("tp8-zz9\n", "line 1"),
])
def test_bad_files_say_which_line_and_why(tmp_path: Path, text: str, fragment: str) -> None:
    message = error_reading(tmp_path / "runnable.txt", text,
                            lambda path: read_runnable_layouts(path, GPUS))
    assert fragment in message


def test_no_valid_layout_in_the_file_is_an_error() -> None:
    bad = read_runnable_layouts_from(["tp=3,pp=1"])
    with pytest.raises(SpecError, match="none of its 1 layouts is a valid layout"):
        plan_profiling(CM, k=1, runnable=bad)


def read_runnable_layouts_from(lines: list[str]) -> RunnableLayouts:
    from parsearch.layout.spec import parse_layout_string

    return RunnableLayouts("inline", tuple(parse_layout_string(x, GPUS) for x in lines))


def test_cli_candidates_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "runnable.txt"
    path.write_text("\n".join([POOL[3].key(), POOL[5].key(), "tp=3,pp=1"]) + "\n",
                    encoding="utf-8")
    args = ["plan-profiling", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus",
            str(GPUS), "--global-batch", "64", "--seq-len", "4096",
            "--micro-batch-sizes", "1,2", "--k", "2", "--format", "json"]
    assert main([*args, "--candidates", str(path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["runnable_layouts_file"] == str(path)
    assert doc["runnable_layouts_not_valid"] == ["tp3-cp1-pp1-vpp1-ep1-etp1-mbs1-sp0-rnone"]
    assert doc["picks"]
    assert {p["key"] for p in doc["picks"]} <= {POOL[3].key(), POOL[5].key()}
    assert main([*args, "--candidates", "12"]) == 0  # a count still works
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:  # argparse refuses the value
        main([*args, "--candidates", str(tmp_path / "missing.txt")])
    assert exit_info.value.code == 2
    assert "neither a number of shapes nor a file" in capsys.readouterr().err
