"""The two callers of the fill: the end of a launch (`complete_rank_files`, the nodes
still connected) and `orchestrator logs RUN --fetch` (`fetch_incomplete`, which connects
again to what status.json recorded: host, user, port, interpreter, the SSH options)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from orchestrator.backends import close_all, connect_cluster
from orchestrator.backends.base import NodeConnection
from orchestrator.console.sink import LogSink
from orchestrator.errors import ConfigError, OrchestratorError
from orchestrator.hosts.hostfile import Cluster, Host
from orchestrator.nodes.refill.fetch import fill_gaps
from orchestrator.nodes.refill.gaps import Gap, rank_files
from orchestrator.options.reaching import SshOptions
from orchestrator.options.running import DEFAULT_RUN_DIR
from orchestrator.plan.launch_plan import NODE_RUNS_DIR, LaunchPlan
from orchestrator.record.runs import RunRecord, controller_alive
from orchestrator.record.states import RunState


@dataclass(frozen=True)
class Completion:
    """What the end of a launch did to the rank files its record could not take whole."""

    filled: tuple[int, ...] = ()
    still: tuple[Gap, ...] = ()

    def status(self, ssh: SshOptions | None) -> dict:
        """status.json's list of the rank files still incomplete, and how `logs --fetch`
        reaches their nodes: the launch's SSH options that differ from the defaults."""
        if not self.still:
            return {}
        entry: dict = {"incomplete_logs": [gap.as_status() for gap in self.still]}
        if ssh is not None:
            options = {k: v for k, v in dataclasses.asdict(ssh).items() if v not in (None, False)}
            if options.get("identity_files") == ():
                del options["identity_files"]
            if options:
                entry["ssh_options"] = {
                    k: list(v) if isinstance(v, tuple) else v for k, v in options.items()
                }
        return entry

    def kept_copies(self, run_id: str) -> str | None:
        """status.json's node_copies when the nodes' copies must stay to complete the record."""
        if not self.still:
            return None
        return (
            f"kept ({rank_files(self.still)} incomplete here; `orchestrator logs {run_id} "
            f"--fetch` completes them from these): ~/{NODE_RUNS_DIR}/{run_id} on each node"
        )

    def lines(self, run_id: str, run_dir: str, status_error: OSError | None) -> list[str]:
        """The console's closing lines about the rank files."""
        lines = []
        if self.filled:
            lines.append(
                f"{rank_files(self.filled, ('was', 'were'))} completed from the nodes' copies"
            )
        if not self.still:
            return lines
        if status_error is None:
            where = "" if run_dir == DEFAULT_RUN_DIR else f" --run-dir {run_dir}"
            lines.append(
                f"{rank_files(self.still)} incomplete: run 'orchestrator logs {run_id} "
                f"--fetch{where}' when there is space"
            )
        else:
            copies = ", ".join(gap.copy() for gap in self.still)
            lines.append(
                f"{rank_files(self.still)} incomplete, and status.json could not record it: "
                f"the nodes keep the whole output in {copies}"
            )
        return lines


def complete_rank_files(
    plan: LaunchPlan, connections: Sequence[NodeConnection], sink: LogSink
) -> Completion:
    """At the end of a launch (the sink closed): fill the rank files that the run record
    could not take whole from the nodes' copies of this attempt."""
    if sink.logs_dir is None:
        return Completion()
    node_of = {rank: node for node in plan.nodes for rank in node.ranks}
    gaps = [
        Gap(
            rank, node.name, node.node_dir, start, size, node.python, node.host.user, node.host.port
        )
        for rank, (start, size) in sink.incomplete().items()
        for node in [node_of[rank]]
    ]
    if not gaps:
        return Completion()
    index_of = {node.node_dir: index for index, node in enumerate(plan.nodes)}
    still, _ = fill_gaps(
        gaps, lambda gap: connections[index_of[gap.node_dir]], sink.logs_dir, sink.mask
    )
    left = {gap.rank for gap in still}
    return Completion(tuple(g.rank for g in gaps if g.rank not in left), tuple(still))


def fetch_incomplete(record: RunRecord, say: Callable[[str], None]) -> int:
    """`orchestrator logs RUN --fetch`: complete the rank files that status.json lists as
    incomplete from the nodes' copies, and take them off the list."""
    status = record.read_status()
    entries = status.get("incomplete_logs") or []
    state = RunState.parse(status.get("state"))
    running = state is not None and not state.is_final
    if running and controller_alive(status):
        raise ConfigError(f"run {record.run_id} is still running; fetch once it has ended")
    if running and not entries:
        raise ConfigError(
            f"run {record.run_id}: its controller ended without writing the run's end to "
            f"{record.status_path} (was its disk full?), so no rank file is listed to complete; "
            f"each node keeps its ranks' whole output in ~/{NODE_RUNS_DIR}/{record.run_id}/"
        )
    if not isinstance(entries, list) or not entries:
        raise ConfigError(
            f"run {record.run_id}: no rank file is listed as incomplete in "
            f"{record.status_path}; nothing to fetch"
        )
    gaps = [Gap.from_status(entry, record.status_path) for entry in entries]
    ssh = status.get("ssh_options") or {}
    try:
        # a record written before the field was named for its flag says config_path
        named = {("ssh_config" if k == "config_path" else k): v for k, v in ssh.items()}
        options = SshOptions(
            **{k: tuple(v) if isinstance(v, list) else v for k, v in named.items()}
        )
    except TypeError:
        raise ConfigError(f"{record.status_path}: unreadable ssh_options: {ssh!r}") from None
    except ConfigError as exc:  # an --identity file the launch named, gone since
        raise ConfigError(f"{record.status_path}: the launch's SSH options: {exc}") from None
    nodes = list(dict.fromkeys(gap.node for gap in gaps))
    pythons = {gap.node: gap.python for gap in gaps}
    hosts = tuple(
        Host(name, user=user, port=port, python=pythons[(name, user, port)])
        for name, user, port in nodes
    )
    connections = connect_cluster(Cluster(hosts, str(record.status_path)), options)

    def commit(open_gaps: list[Gap]) -> None:
        """Record what stays incomplete before the files change: never listed as missing
        what a file already holds (a second fetch would then add it twice)."""
        status["incomplete_logs"] = [gap.as_status() for gap in open_gaps]
        if not open_gaps:
            del status["incomplete_logs"]
            status.pop("ssh_options", None)
            if str(status.get("node_copies", "")).startswith("kept (rank file"):
                status["node_copies"] = (
                    "kept (the rank files are complete; `orchestrator clean` removes them): "
                    f"~/{NODE_RUNS_DIR}/{record.run_id} on each node"
                )
        error = record.write_status(status)
        if error is not None:
            raise OrchestratorError(
                f"cannot update {record.status_path}: {error.strerror or error}; "
                "no rank file was changed"
            )

    try:
        still, failed = fill_gaps(
            gaps, lambda gap: connections[nodes.index(gap.node)], record.logs_dir, commit=commit
        )
    finally:
        close_all(connections)
    if still:  # why each is still incomplete, when status.json can take it
        status["incomplete_logs"] = [gap.as_status() for gap in still]
        record.write_status(status)
    left = {gap.rank for gap in still}
    for gap in gaps:
        if gap.rank not in left:
            say(f"rank-{gap.rank}.log: completed from {gap.copy()}")
    if not failed:
        return 0
    why = "\n".join(f"  rank {r.gap.rank}: {r.why}" for r in failed)
    error_type = ConfigError if all(r.gone for r in failed) else OrchestratorError
    raise error_type(f"{rank_files(still)} still incomplete:\n{why}")
