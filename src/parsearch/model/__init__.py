"""Model specs from files: Hugging Face configs and the safe reading of model files.

The package grows toward holding the model specs, presets, config loading and parameter
counts (the top-level :mod:`parsearch.workload`, :mod:`parsearch.presets`,
:mod:`parsearch.model_files` and :mod:`parsearch.params` move here as they change).
"""
