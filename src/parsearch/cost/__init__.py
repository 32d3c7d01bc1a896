"""Analytic cost model: FLOPs, memory and the pipeline-stage split."""
