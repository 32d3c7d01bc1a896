"""Megatron pipeline layout strings: moved to :mod:`parsearch.model.pipeline_layout`.

They are part of the training setup (``TrainingSpec.pipeline_layout``), which
``model`` checks, and ``model`` sits below ``layout``.  Kept here only while
``cost/stages.py`` imports them from this path; new code imports the model module.
"""

from parsearch.model.pipeline_layout import layout_layer_counts, parse_pipeline_layout

__all__ = ["layout_layer_counts", "parse_pipeline_layout"]
