"""Models: their specs, presets, config loading and parameter counts.

* :mod:`.specs`: ``ModelSpec`` (dense or MoE, MLA, MTP, attention variants) and
  ``TrainingSpec`` (sequence, batch, precision, optimizer, memory features);
* :mod:`.presets`: the built-in models with their sources;
* :mod:`.hf_config` and :mod:`.config_text`: Hugging Face ``config.json`` reading;
* :mod:`.files`: the safe reading of model files (size limits, clear errors);
* :mod:`.params`: parameter counts, total and active.
* :mod:`.pipeline_layout`: Megatron's pipeline layout strings (uneven stage splits).
"""
