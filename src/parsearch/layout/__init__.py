"""Parallel layouts: the layout type, the rules a layout must satisfy, and enumeration.

* :mod:`.spec`: ``Layout`` (one ``(TP, PP, CP, EP, ETP, VPP)`` choice with its DP,
  micro-batch size, sequence parallelism and recompute), its string forms;
* :mod:`.rules`: the normative layout-space rules (``shared/spec/layout-space.md``);
* :mod:`.space`: enumeration of every valid layout as a columnar table;
* :mod:`.pipeline`: re-exports :mod:`parsearch.model.pipeline_layout` (Megatron's pipeline
  layout strings, uneven splits) for old importers;
* :mod:`.soft_rules`: advisories that do not make a layout invalid.
"""

from parsearch.layout.spec import Layout, min_gpus_for, parse_layout_key, parse_layout_string

__all__ = ["Layout", "min_gpus_for", "parse_layout_key", "parse_layout_string"]
