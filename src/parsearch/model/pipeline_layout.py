"""Megatron's ``--pipeline-model-parallel-layout`` strings: parse them into virtual stages.

The string lists the virtual pipeline stages in order, separated by ``|``;
each holds ``E`` (embedding), ``t`` (a transformer layer), ``m`` (an MTP
layer) and ``L`` (the loss / output layer).  ``x*N`` repeats one item and
``(...)*N`` a group (Megatron-Core ``pipeline_parallel_layout.py``, as used by
the Megatron-Bridge DeepSeek-V3 recipes, e.g. ``Et*4|(t*4|)*14tmL``).
Virtual stage ``j`` runs on pipeline rank ``j % pp`` as model chunk ``j // pp``.
"""

from __future__ import annotations

import re
from functools import lru_cache

from parsearch.errors import SpecError

_ITEMS = frozenset("EtmL|")
_REPEAT = re.compile(r"\*(\d+)")


def _expand(text: str, where: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char == "(":
            depth, j = 1, i + 1
            while j < len(text) and depth:
                depth += {"(": 1, ")": -1}.get(text[j], 0)
                j += 1
            if depth:
                raise SpecError(f"pipeline layout {where!r}: unbalanced parenthesis")
            body = _expand(text[i + 1:j - 1], where)
            i = j
        elif char in _ITEMS:
            body, i = char, i + 1
        else:
            raise SpecError(f"pipeline layout {where!r}: unexpected {char!r}; use E, t, m, L, "
                            "'|', '*N' and parentheses")
        match = _REPEAT.match(text, i)
        if match:
            count = int(match.group(1))
            if count > 100_000:
                raise SpecError(f"pipeline layout {where!r}: repeat {count} is too large")
            body, i = body * count, match.end()
        out.append(body)
    return "".join(out)


@lru_cache(maxsize=256)
def parse_pipeline_layout(text: str) -> tuple[str, ...]:
    """The virtual stages of a layout string, each as its items.

    >>> parse_pipeline_layout("Et*2|(t*3|)*2tmL")
    ('Ett', 'ttt', 'ttt', 'tmL')
    """
    stages = tuple(_expand(text.replace(" ", ""), text).split("|"))
    if not stages or "E" not in stages[0] or "L" not in stages[-1]:
        raise SpecError(f"pipeline layout {text!r}: the first virtual stage must hold the "
                        "embedding E and the last the loss L")
    if "".join(stages).count("E") != 1 or "".join(stages).count("L") != 1:
        raise SpecError(f"pipeline layout {text!r}: exactly one E and one L")
    if any(not stage for stage in stages):
        raise SpecError(f"pipeline layout {text!r}: every virtual stage needs at least one item")
    return stages


def layout_layer_counts(text: str) -> tuple[int, ...]:
    """Transformer layers per virtual stage of a layout string.

    >>> layout_layer_counts("Et|(tt|)*2tmL")
    (1, 2, 2, 1)
    """
    return tuple(stage.count("t") for stage in parse_pipeline_layout(text))


def format_pipeline_layout(counts: tuple[int, ...], mtp_layers: int) -> str:
    """Megatron's ``--pipeline-model-parallel-layout`` for these per-virtual-stage layer counts.

    ``E`` embedding, ``t`` layer, ``m`` MTP layer, ``L`` loss; stages joined by ``|``
    (Megatron-Core ``pipeline_parallel_layout.py``); runs of equal middle stages as
    ``(t*k|)*n``.

    >>> format_pipeline_layout((7, 8, 8, 7), 0)
    'Et*7|(t*8|)*2t*7L'
    >>> format_pipeline_layout((0, 1, 1, 0), 1)
    'E|(t|)*2mL'
    """
    def layers(count: int) -> str:
        return f"t*{count}" if count > 1 else "t" * count

    first = "E" + layers(counts[0])
    last = layers(counts[-1]) + "m" * mtp_layers + "L"
    if len(counts) == 1:
        return "E" + last
    middle = ""
    j = 1
    while j < len(counts) - 1:
        run = 1
        while j + run < len(counts) - 1 and counts[j + run] == counts[j]:
            run += 1
        stage = layers(counts[j]) + "|"
        middle += f"({stage})*{run}" if run > 1 else stage
        j += run
    return f"{first}|{middle}{last}"
