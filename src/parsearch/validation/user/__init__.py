"""The user's own measurements and ``parsearch calibrate`` on them.

:mod:`.log_lines` and :mod:`.megatron_logs` read Megatron-LM and Megatron-Bridge logs,
:mod:`.measurements` reads measurement tables (CSV/YAML) and logs,
:mod:`.user_calibration` fits a profile to them and :mod:`.user_report` says how it went.
"""
