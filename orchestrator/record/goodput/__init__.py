"""A run's goodput: where its wall time went, in phases that add up to it.

phases.py  the phases, per attempt and in total, from the record's data (pure functions)
kept.py    computed as the run ends, from status.json and metrics.jsonl, and kept there
words.py   the goodput in words: the run's last line and `orchestrator status`'s table
"""
