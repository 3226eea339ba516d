"""Completing the rank files that the controller's run record could not take whole.

When the controller's disk fills while a job runs, a rank's file (logs/rank-N.log) stops at
its first lost write (orchestrator.record.logfile), while the node keeps everything the rank
printed in its node directory (rank-N.out). A `Gap` is such a stretch of a rank file: bytes
[offset, end) hold only the start of what the rank printed in one attempt. Filling it
rewrites the file as what it held before `offset`, the node's rank-N.out (masked as the
stream masks it, its last line ended as the stream ends it), then what it holds after `end`
(a later attempt's lines). The new file is written beside the old one and renamed over it,
so a fill that fails (still no space, a node gone) leaves the file as it was.

This runs at the end of a launch (`complete_rank_files`) and, for what is still missing
then, with `orchestrator logs RUN --fetch` (`fetch_incomplete`), which reaches the nodes
again by what status.json recorded: host, user, port, interpreter and the SSH options.

complete.py  the two callers of the fill
fetch.py     filling gaps from the nodes' copies
gaps.py      a gap in a run's logs
"""

from orchestrator.nodes.refill.complete import Completion, complete_rank_files, fetch_incomplete

__all__ = ["Completion", "complete_rank_files", "fetch_incomplete"]
