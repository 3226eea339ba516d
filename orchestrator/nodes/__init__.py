"""Work on every node at once through its agent: a command (execute.py, `exec`), the
preflight probe, removing the nodes' copies of a run, completing rank files a full disk
cut short (refill/).

clean.py   `orchestrator clean`
copies.py  the nodes' copies of a run: what each node keeps under ~/.orchestrator/runs/RUN
probe.py   the preflight probe
paths/     the path check
"""
