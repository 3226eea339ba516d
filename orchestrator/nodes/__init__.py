"""Work on every node at once through its agent: a command (execute.py, `exec`), the
preflight probe, removing the nodes' copies of a run, completing rank files a full disk
cut short (refill/)."""
