"""The parallel layout of one training job.

A :class:`Layout` holds the degrees a user chooses; ``dp``, ``edp`` and
``min_gpus`` are derived (``shared/spec/layout-space.md``, "Derived
quantities").  A layout is only a description: whether it is *valid* for a
model and training setup is decided by :mod:`parsearch.layout.rules`.

The key ``tp4-cp2-pp8-vpp2-ep8-etp1-mbs1-sp1-rsel`` round-trips through
:func:`Layout.key` and :func:`parse_layout_key`; the user-facing string
``"tp=8,pp=4,sp=true"`` is read by :func:`parse_layout_string`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from parsearch.errors import SpecError
from parsearch.model.specs import RECOMPUTE_MODES, Recompute

DEGREE_KEYS: tuple[str, ...] = ("tp", "pp", "cp", "ep", "etp", "vpp", "mbs")
LAYOUT_STRING_KEYS: tuple[str, ...] = (*DEGREE_KEYS, "sp", "recompute")

_RECOMPUTE_SHORT = {"none": "rnone", "selective": "rsel", "full": "rfull"}
_RECOMPUTE_FROM_SHORT = {v: k for k, v in _RECOMPUTE_SHORT.items()}


def min_gpus_for(tp: int, cp: int, pp: int, ep: int, etp: int) -> int:
    """Smallest world size that a layout with these degrees can run on.

    N must be a multiple of both ``pp*tp*cp`` (dense mesh, R2) and
    ``pp*ep*etp`` (expert mesh, R3), so the answer is
    ``pp * lcm(tp*cp, ep*etp)`` (layout-space spec, "Derived quantities").

    >>> min_gpus_for(tp=2, cp=1, pp=1, ep=8, etp=1)
    8
    >>> min_gpus_for(tp=4, cp=1, pp=1, ep=3, etp=2)  # lcm(4, 6), not max
    12
    """
    return pp * math.lcm(tp * cp, ep * etp)


@dataclass(frozen=True, order=True)
class Layout:
    """Degrees of parallelism for one job of ``num_gpus`` GPUs."""

    num_gpus: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1
    vpp: int = 1
    mbs: int = 1
    sp: bool = False
    recompute: Recompute = "none"

    @property
    def dp(self) -> int:
        """Data-parallel size of the dense mesh: ``N / (tp*cp*pp)`` (0 if it does not divide)."""
        model = self.tp * self.cp * self.pp
        return self.num_gpus // model if self.num_gpus % model == 0 else 0

    @property
    def edp(self) -> int:
        """Data-parallel size of the expert mesh: ``N / (pp*ep*etp)`` (0 if it does not divide)."""
        model = self.pp * self.ep * self.etp
        return self.num_gpus // model if self.num_gpus % model == 0 else 0

    @property
    def min_gpus(self) -> int:
        """``pp * lcm(tp*cp, ep*etp)``: see :func:`min_gpus_for`."""
        return min_gpus_for(self.tp, self.cp, self.pp, self.ep, self.etp)

    def key(self) -> str:
        """A compact, unique, round-trippable name (without the GPU count)."""
        return (
            f"tp{self.tp}-cp{self.cp}-pp{self.pp}-vpp{self.vpp}-ep{self.ep}-etp{self.etp}"
            f"-mbs{self.mbs}-sp{int(self.sp)}-{_RECOMPUTE_SHORT[self.recompute]}"
        )

    def to_dict(self, *, moe: bool = True) -> dict[str, Any]:
        """The JSON layout object of the CLI contract (plus nothing else).

        A dense model has no expert mesh: pass ``moe=False`` and ``edp`` is
        reported as ``dp`` (layout-space spec, R3).
        """
        return {
            "tp": self.tp,
            "pp": self.pp,
            "cp": self.cp,
            "ep": self.ep,
            "etp": self.etp,
            "vpp": self.vpp,
            "dp": self.dp,
            "edp": self.edp if moe else self.dp,
            "mbs": self.mbs,
            "sp": self.sp,
            "recompute": self.recompute,
            "min_gpus": self.min_gpus,
        }

    def with_gpus(self, num_gpus: int) -> Layout:
        """The same degrees on another world size."""
        return replace(self, num_gpus=num_gpus)

    def as_fields(self) -> dict[str, Any]:
        """Constructor fields (for ``Layout(**fields)``)."""
        return asdict(self)


def _parse_bool(key: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise SpecError(f"layout: {key}={text!r} is not a boolean; use true or false")


def _parse_degree(key: str, text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        shown = repr(text) if len(text) <= 40 else repr(text[:37]) + "..."
        raise SpecError(f"layout: {key}={shown} is not an integer") from None
    if value < 1:
        raise SpecError(f"layout: {key}={value} must be a positive integer")
    return value


def parse_layout_string(text: str, num_gpus: int) -> Layout:
    """Read ``"tp=8,pp=4,cp=1,sp=true,recompute=selective"`` into a :class:`Layout`.

    Omitted keys take their defaults (1, false, ``none``).  Unknown keys,
    repeated keys and malformed values raise :class:`SpecError`.  The key that
    ``search`` prints (``tp8-cp1-pp4-...-rsel``, :meth:`Layout.key`) is read too.

    >>> parse_layout_string("tp=8,pp=4,sp=true", num_gpus=64).key()
    'tp8-cp1-pp4-vpp1-ep1-etp1-mbs1-sp1-rnone'
    >>> parse_layout_string("tp2-cp1-pp4-vpp1-ep8-etp1-mbs2-sp1-rsel", num_gpus=64).recompute
    'selective'
    """
    if "=" not in text and "," not in text and "-" in text.strip():
        try:  # the compact key of search's tables
            return parse_layout_key(text.strip().lower(), num_gpus)
        except SpecError:
            raise SpecError(
                f"layout: {text.strip()!r} is neither key=value pairs (e.g. "
                "\"tp=8,pp=4,sp=true\") nor a layout key as search prints it "
                "(e.g. tp8-cp1-pp4-vpp1-ep1-etp1-mbs1-sp1-rnone)"
            ) from None
    values: dict[str, Any] = {}
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        if "=" not in item:
            raise SpecError(
                f"layout: {item!r} is not key=value; write e.g. \"tp=8,pp=4,sp=true\""
            )
        key, _, value = item.partition("=")
        key = key.strip().lower()
        if key not in LAYOUT_STRING_KEYS:
            raise SpecError(
                f"layout: unknown key {key!r}; valid keys are {', '.join(LAYOUT_STRING_KEYS)}"
            )
        if key in values:
            raise SpecError(f"layout: key {key!r} is given twice")
        if key == "sp":
            values[key] = _parse_bool(key, value)
        elif key == "recompute":
            mode = value.strip().lower()
            if mode not in RECOMPUTE_MODES:
                raise SpecError(
                    f"layout: recompute={value!r} is not one of {', '.join(RECOMPUTE_MODES)}"
                )
            values[key] = mode
        else:
            values[key] = _parse_degree(key, value)
    return Layout(num_gpus=num_gpus, **values)


def parse_layout_key(key: str, num_gpus: int) -> Layout:
    """Inverse of :meth:`Layout.key`."""
    fields: dict[str, Any] = {}
    for part in key.split("-"):
        if part in _RECOMPUTE_FROM_SHORT:
            fields["recompute"] = _RECOMPUTE_FROM_SHORT[part]
            continue
        name = part.rstrip("0123456789")
        digits = part[len(name):]
        if name not in (*DEGREE_KEYS, "sp") or not digits:
            raise SpecError(f"layout key {key!r}: cannot read part {part!r}")
        fields[name] = bool(int(digits)) if name == "sp" else int(digits)
    return Layout(num_gpus=num_gpus, **fields)
