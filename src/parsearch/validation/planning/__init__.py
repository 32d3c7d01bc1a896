"""``parsearch plan-profiling``: which layouts to measure next, and how to launch them.

:mod:`.plan_errors` is the plan's error model, :mod:`.plan_profiling` chooses the runs
and :mod:`.plan_launch` turns each into a short logged launch and its script.
"""
