"""Fit each GPU generation's efficiency profile to the published runs (developer tool).

    python benchmarks/calibrate_efficiency.py [--write] [--by family|source]

For every generation: calibrate the residual factors on all of its runs
(:func:`parsearch.validation.fit.calibration.calibrate`: robust loss on the log
ratio, pulled toward the cited priors, bounded by the cited ranges), run the
leave-one-family-out cross-validation for the error bands, and print both.
``--write`` stores the fitted values and the out-of-sample error bands in
``cost_models/efficiency/<generation>.yaml`` (priors and sources unchanged).

The error bands pool two kinds of out-of-sample residual: each calibration run predicted
by the fold that held its family out, and each never-fitted Megatron-Bridge table row of
a model no calibration run holds (``independent_runs.csv``, tag ``MBRIDGE-HELDOUT``: the
calibration's own source and recipe reading, a model it did not see) predicted by the
shipped fit.  Held-out rows whose model has features outside the calibration set's
(:func:`parsearch.cost.coverage.uncovered_features`, gpt-oss-120b's windows and sinks) are
left out: ``explain`` and ``search`` name those features instead of widening every band.
Four Llama 3 runs of one family had made Hopper's dense band 1.17-1.23x of the
prediction; the five held-out Llama 3.1 405B H100 runs measured 0.88-0.96x.
Factors that end on a bound are printed as such: they mean the structure
misses a mechanism, and are listed in the profile's ``source`` line.  Tied factors are
not fitted on their own (``parsearch.validation.fit.factor_ties``): FP8's GEMM efficiency
follows BF16's by the generation's measured large-matmul ratio, attention backward
follows forward by the ratio of their cited priors.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import warnings

from parsearch.cost.coverage import ArchitectureCoverage, coverage_of, uncovered_features
from parsearch.cost.efficiency import efficiency_dir, load_efficiency_profile, profile_to_yaml
from parsearch.validation.fit.calibration import PreparedRow, prepare_rows
from parsearch.validation.fit.crossval import cross_validate, error_bands, heldout_predictions
from parsearch.validation.fit.factor_ties import factor_ties
from parsearch.validation.published.published_runs import load_heldout_runs, load_published_runs

HEADER = """# Efficiency profile for NVIDIA {title} GPUs.
# Every value is a physical quantity with a prior and a cited range (`priors`; sources
# in cost_models/references/). Fitted by benchmarks/calibrate_efficiency.py to the
# published runs (src/parsearch/data/published_runs.csv, read from their public recipes):
# robust loss on log(predicted/measured), pulled toward the priors, inside the ranges.
# `uncertainty`: out-of-sample log-ratio band per kind (leave-one-family-out residuals
# pooled with the never-fitted Megatron-Bridge runs of models the calibration covers)."""
TITLES = {"ampere": "Ampere (A100)", "hopper": "Hopper (H100/H800/H200)",
          "blackwell": "Blackwell (B200/B300/GB200/GB300)"}


def main() -> int:
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--by", choices=("family", "source"), default="family")
    args = parser.parse_args()
    rows = prepare_rows(load_published_runs())
    cv = cross_validate(rows, by=args.by)
    # What the fitted runs' models had, per generation: explain and search name what a
    # model has beyond it (parsearch.cost.coverage); held-out runs beyond it stay out of
    # the bands.
    coverage = {g: coverage_of(r.run.model_spec for r in rows
                               if r.generation == g and r.run.model_spec is not None)
                for g in {r.generation for r in rows}}
    # The bands pool every residual of a run no fit saw: the folds' held-out families,
    # the held-out models' runs (every release) and the calibration table's runs of
    # superseded release lines, each predicted by its generation's fitted profile.
    fitted_ids = {row.id for row in rows}
    older = [row for row in prepare_rows(load_published_runs(), current_only=False)
             if row.id not in fitted_ids]
    profiles = {g: f.profile for g, f in cv.in_sample_profiles.items()}
    heldout = heldout_predictions([*covered_heldout_rows(coverage), *older], profiles)
    bands_all = error_bands([*cv.rows, *heldout], args.by,
                            superseded=frozenset(row.id for row in older))
    for summary in cv.generations:
        g = summary.generation
        fit = cv.in_sample_profiles[g]
        print(f"{g}: {summary.n} runs, MAPE out-of-sample {summary.mape_out:.1%} "
              f"(in-sample {summary.mape_in:.1%}), order accuracy out "
              f"{summary.order_accuracy_out:.0%} over {summary.order_pairs} pairs; "
              f"on a bound: {', '.join(fit.on_bound) or 'none'}")
        for name in fit.fitted:
            prior = fit.profile.priors[name]
            print(f"  {name}: {fit.profile.get(name):.4g} (prior {prior.value:.4g}, "
                  f"range {prior.low:.4g}..{prior.high:.4g})")
        ties = {name: tie for name, tie in factor_ties(fit.profile).items()
                if tie[0] in fit.fitted}
        for name, (anchor, ratio) in ties.items():
            print(f"  {name}: {fit.profile.get(name):.4g} (tied: {ratio:.4f} x {anchor})")
        if fit.unresolved:
            print("  held at the prior (no run resolves it apart from the others): "
                  + ", ".join(fit.unresolved))
        if not args.write:
            continue
        bands = {key.split("/", 1)[1]: band for key, band in bands_all.items()
                 if key.startswith(g + "/")}
        base = load_efficiency_profile(g)
        verdict = ("on a bound: " + ", ".join(fit.on_bound)) if fit.on_bound else "inside"
        note = f"; calibration {verdict}"
        if fit.unresolved:
            note += ("; held at the prior, no run resolves it apart from the others: "
                     + ", ".join(fit.unresolved))
        for name, (anchor, ratio) in ties.items():
            note += f"; {name} = {ratio:.4f} x {anchor} (parsearch.validation.fit.factor_ties)"
        profile = dataclasses.replace(fit.profile, uncertainty=bands, coverage=coverage[g],
                                      source=base.source.split("; calibration")[0] + note)
        path = efficiency_dir() / f"{g}.yaml"
        path.write_text(profile_to_yaml(profile, HEADER.format(title=TITLES.get(g, g))),
                        encoding="utf-8")
        print(f"  wrote {path}")
    return 0


def covered_heldout_rows(coverage: dict[str, ArchitectureCoverage]) -> list[PreparedRow]:
    """The held-out Megatron-Bridge rows whose models ``coverage`` (per generation) covers."""
    out = []
    for row in prepare_rows(load_heldout_runs(), include_partial=True, current_only=False):
        cover = coverage.get(row.generation)
        if cover is not None and row.run.model_spec is not None \
                and not uncovered_features(row.run.model_spec, cover):
            out.append(row)
    return out


if __name__ == "__main__":
    sys.exit(main())
