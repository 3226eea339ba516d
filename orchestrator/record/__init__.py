"""The run record: runs/<run-id>/ (runs.py), the log files the stream appends to
(logfile.py), and the bad-node list that node faults add to (bad_nodes.py).

goodput/       where a run's wall time went: its phases, kept in status.json, in words
older_names.py what an older orchestrator wrote under another name, read back under today's
plain.py       frozen values
recoveries.py  A node replaced by a spare (--spares), as the run record keeps it
states.py      A run's state, and the one rule for the state a reader of its record sees
world.py       the world a run ran on over time, as the run record keeps it
"""
