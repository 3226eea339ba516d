"""The run record: runs/<run-id>/ (runs.py), the log files the stream appends to
(logfile.py), and the bad-node list that node faults add to (bad_nodes.py)."""
