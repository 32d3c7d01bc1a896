"""Which architectures a profile's calibration runs had, and what a model has beyond them.

An efficiency profile is fitted to published runs of one GPU generation, and its error
bands (``uncertainty``) come from those runs' out-of-sample residuals.  Both say nothing
about an architecture no such run had: a head dim, a sliding window or an MLP the
calibration never saw is priced by the same formulas, but nothing measured backs the
number.  The Megatron-Bridge tables show what that can cost: gpt-oss-120b (head dim 64,
128-token windows on half its layers, learnable attention sinks) was predicted 1.3-1.7x
too fast on its held-out rows while the calibrated families stayed within their bands
(``src/parsearch/data/INDEPENDENT_RUNS.md``, held-out rows).  Pricing the ops Megatron-Core
runs unfused for it (:mod:`parsearch.cost.unfused_ops`: YaRN RoPE, the GLU clamp, the
experts' FC2 bias) and its head dim's exponential share (:func:`parsearch.cost.softmax.
head_dim_scale`) brings its recipe-read rows to 1.1-1.4x, and its window kernels as cuDNN
runs them (:mod:`parsearch.cost.window_attention`) to 1.09-1.30x (2026-12-06); the rest is
not explained.

:func:`coverage_of` summarises the models of a calibration set (written into the profile
by ``benchmarks/calibrate_efficiency.py``); :func:`uncovered_features` names what a model
has outside it, for ``explain`` and ``search`` to print beside their ranges.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from parsearch.errors import SpecError
from parsearch.model.specs import ModelSpec


@dataclass(frozen=True)
class ArchitectureCoverage:
    """The architectural features present among a calibration set's models."""

    head_dims: tuple[int, ...]  # attention head dims of the non-MLA models
    mlp_activations: tuple[str, ...]
    sliding_window: bool
    mla: bool
    qkv_bias: bool
    moe: bool
    dense: bool

    def to_dict(self) -> dict[str, Any]:
        return {"head_dims": list(self.head_dims),
                "mlp_activations": list(self.mlp_activations),
                "sliding_window": self.sliding_window, "mla": self.mla,
                "qkv_bias": self.qkv_bias, "moe": self.moe, "dense": self.dense}


def coverage_of(models: Iterable[ModelSpec]) -> ArchitectureCoverage:
    """The features of ``models`` (the calibration runs' model specs).

    >>> from parsearch.model.presets import get_preset
    >>> cov = coverage_of([get_preset("llama3-8b"), get_preset("mixtral-8x7b")])
    >>> cov.head_dims, cov.sliding_window, cov.moe, cov.dense
    ((128,), False, True, True)
    """
    specs = list(models)
    if not specs:
        raise SpecError("coverage_of: no calibration models given")
    return ArchitectureCoverage(
        head_dims=tuple(sorted({m.head_dim for m in specs if m.mla is None})),
        mlp_activations=tuple(sorted({m.mlp_activation for m in specs})),
        sliding_window=any(m.sliding_window > 0 for m in specs),
        mla=any(m.mla is not None for m in specs),
        qkv_bias=any(m.qkv_bias for m in specs),
        moe=any(m.moe is not None for m in specs),
        dense=any(m.moe is None for m in specs),
    )


def widened(coverage: ArchitectureCoverage | None, models: Iterable[ModelSpec]
            ) -> ArchitectureCoverage | None:
    """``coverage`` plus the features of ``models`` (a user's own calibration runs);
    ``None`` stays ``None`` (no record of the base calibration: no claim either way).

    >>> from parsearch.model.presets import get_preset
    >>> base = coverage_of([get_preset("llama3-8b")])
    >>> widened(base, [get_preset("gpt-oss-120b")]).head_dims
    (64, 128)
    >>> widened(None, [get_preset("gpt-oss-120b")]) is None
    True
    """
    specs = list(models)
    if coverage is None or not specs:
        return coverage
    extra = coverage_of(specs)
    return ArchitectureCoverage(
        head_dims=tuple(sorted({*coverage.head_dims, *extra.head_dims})),
        mlp_activations=tuple(sorted({*coverage.mlp_activations, *extra.mlp_activations})),
        **{name: getattr(coverage, name) or getattr(extra, name)
           for name in ("sliding_window", "mla", "qkv_bias", "moe", "dense")})


def uncovered_features(model: ModelSpec, coverage: ArchitectureCoverage | None
                       ) -> tuple[str, ...]:
    """What ``model`` has that no calibration run had (empty: all covered or no record).

    >>> from parsearch.model.presets import get_preset
    >>> cov = coverage_of([get_preset("qwen3-30b-a3b"), get_preset("llama3-70b")])
    >>> uncovered_features(get_preset("llama3-8b"), cov)
    ()
    >>> for note in uncovered_features(get_preset("gpt-oss-120b"), cov):
    ...     print(note)
    attention head dim 64 (calibrated: 128)
    sliding-window attention (128 tokens on 18 of 36 layers)
    QKV bias
    """
    if coverage is None:
        return ()
    notes: list[str] = []
    if model.mla is not None:
        if not coverage.mla:
            notes.append("multi-head latent attention (MLA)")
    elif model.head_dim not in coverage.head_dims:
        dims = ", ".join(str(d) for d in coverage.head_dims) or "MLA only"
        notes.append(f"attention head dim {model.head_dim} (calibrated: {dims})")
    if model.sliding_window > 0 and not coverage.sliding_window:
        layers = model.sliding_window_layers or model.num_layers
        notes.append(f"sliding-window attention ({model.sliding_window} tokens on {layers} "
                     f"of {model.num_layers} layers)")
    if model.qkv_bias and not coverage.qkv_bias:
        notes.append("QKV bias")
    if model.mlp_activation not in coverage.mlp_activations:
        notes.append(f"{model.mlp_activation} MLP")
    if model.moe is not None and not coverage.moe:
        notes.append("mixture-of-experts layers")
    if model.moe is None and not coverage.dense:
        notes.append("dense MLP layers")
    return tuple(notes)


def coverage_note(features: tuple[str, ...]) -> str:
    """The line ``explain`` and ``search`` print under a prediction ("" when covered).

    >>> coverage_note(("QKV bias",)).startswith("note: no calibration run of this GPU "
    ...                                         "generation has QKV bias;")
    True
    """
    if not features:
        return ""
    return (f"note: no calibration run of this GPU generation has {'; '.join(features)}; the "
            "ranges do not cover these (held-out gpt-oss-120b, with such features, is predicted "
            "1.1-1.3x too fast)")


def parse_coverage(raw: Any, where: str) -> ArchitectureCoverage:
    """A profile's ``calibrated_on`` mapping; errors name the file and the field."""
    if not isinstance(raw, dict):
        raise SpecError(f"efficiency profile {where}: calibrated_on must be a mapping")
    expected = {"head_dims", "mlp_activations", "sliding_window", "mla", "qkv_bias", "moe",
                "dense"}
    if set(raw) != expected:
        missing, unknown = sorted(expected - set(raw)), sorted(set(raw) - expected)
        raise SpecError(f"efficiency profile {where}: calibrated_on needs exactly "
                        f"{', '.join(sorted(expected))}"
                        + (f"; missing {', '.join(missing)}" if missing else "")
                        + (f"; unknown {', '.join(unknown)}" if unknown else ""))
    dims, acts = raw["head_dims"], raw["mlp_activations"]
    if not (isinstance(dims, list) and all(isinstance(d, int) and not isinstance(d, bool)
                                           and d > 0 for d in dims)):
        raise SpecError(f"efficiency profile {where}: calibrated_on.head_dims must be a list "
                        f"of positive integers, got {str(dims)[:60]}")
    if not (isinstance(acts, list) and all(isinstance(a, str) for a in acts)):
        raise SpecError(f"efficiency profile {where}: calibrated_on.mlp_activations must be "
                        f"a list of names, got {str(acts)[:60]}")
    flags = {}
    for name in ("sliding_window", "mla", "qkv_bias", "moe", "dense"):
        if not isinstance(raw[name], bool):
            raise SpecError(f"efficiency profile {where}: calibrated_on.{name} must be true "
                            f"or false, got {str(raw[name])[:40]}")
        flags[name] = raw[name]
    return ArchitectureCoverage(head_dims=tuple(sorted(set(dims))),
                                mlp_activations=tuple(sorted(set(acts))), **flags)
