"""`orchestrator status RUN`'s text for the deadline parts of a record: a SLURM run's
attempts and an SSH run's time limit warning."""

from __future__ import annotations

from orchestrator.cli.views import status_text

BASE = {"run_id": "r", "state": "succeeded", "exit_code": 0, "backend": "slurm"}


def carried() -> dict:
    """A SLURM run carried across a time limit, as status.json holds it."""
    return {
        **BASE,
        "slurm_job_id": 12,
        "slurm_state": "COMPLETED",
        "resubmits_left": 9,
        "attempts": [
            {
                "attempt": 1,
                "job_id": 11,
                "running_at": "2026-11-28T14:38:34.844Z",
                "warned_at": "2026-11-28T14:39:01.318Z",
                "warning": "SIGUSR1 for the time limit",
                "ended_at": "2026-11-28T14:39:02.929Z",
                "slurm_state": "FAILED",
                "why": "its ranks stopped on the time limit's warning",
                "next": "resubmitted as job 12",
            },
            {
                "attempt": 2,
                "job_id": 12,
                "running_at": "2026-11-28T14:39:05.200Z",
                "ended_at": "2026-11-28T14:39:47.280Z",
                "slurm_state": "COMPLETED",
                "why": "completed",
            },
        ],
    }


def test_the_attempts_of_a_run_carried_across_time_limits() -> None:
    lines = status_text(carried()).splitlines()
    at = lines.index("  attempts: 2 (resubmits left: 9)")
    assert lines[at + 1 : at + 3] == [
        "    1. job 11 ran 14:38:34-14:39:02: its ranks stopped on the time limit's warning "
        "(FAILED); SIGUSR1 for the time limit at 14:39:01; resubmitted as job 12",
        "    2. job 12 ran 14:39:05-14:39:47: completed (COMPLETED)",
    ]


def test_a_record_an_older_orchestrator_wrote_shows_the_same() -> None:
    """Before SLURM's jobs were attempts, status.json listed them as `segments`, each
    numbered `segment`: `status` reads such a record as it reads today's."""
    status = carried()
    older = {k: v for k, v in status.items() if k != "attempts"}
    older["segments"] = [
        {"segment": e["attempt"], **{k: v for k, v in e.items() if k != "attempt"}}
        for e in status["attempts"]
    ]
    shown = status_text(older)
    assert "  attempts: 2 (resubmits left: 9)" in shown.splitlines()
    assert shown == status_text(status)


def test_one_job_without_a_warning_shows_no_attempts() -> None:
    status = {**BASE, "attempts": [{"attempt": 1, "job_id": 3, "why": "completed"}]}
    assert "attempts" not in status_text(status)


def test_an_ssh_runs_time_limit_and_its_warning() -> None:
    status = {
        **BASE,
        "backend": "ssh",
        "time_limit_s": 40,
        "warning": {
            "signal": "USR1",
            "sent_at": "2026-11-28T14:00:30.000Z",
            "before_limit_s": 10,
            "ranks_signalled": 4,
            "ranks_not_catching_it": [],
        },
    }
    assert (
        "  time limit 40 s; SIGUSR1 to 4 rank(s) at 2026-11-28T14:00:30.000Z, 10 s before it"
        in status_text(status).splitlines()
    )


def test_the_world_of_a_run_that_went_on_with_fewer_nodes() -> None:
    first = {"attempt": 1, "nodes": ["a", "b", "c"], "ranks": 6, "why": "launch"}
    status = {
        **BASE,
        "backend": "ssh",
        "world": [
            {**first, "since": "2026-11-28T14:38:34.844Z"},
            {
                "attempt": 2,
                "nodes": ["a", "c"],
                "ranks": 4,
                "since": "2026-11-28T14:39:01.318Z",
                "why": "b (lost: gone) left out, no spare left: 2 of 3 nodes",
            },
        ],
    }
    lines = status_text(status).splitlines()
    at = lines.index("  world: 3 -> 2 node(s)")
    assert lines[at + 2] == (
        "    attempt 2: 2 node(s), 4 rank(s) since 2026-11-28T14:39:01.318Z (b (lost: gone) "
        "left out, no spare left: 2 of 3 nodes): a, c"
    )
    # A world that never changed its size says nothing.
    assert "world" not in status_text({**BASE, "world": [{**first, "since": "x"}]})


def test_a_slurm_run_whose_nodes_keep_their_files_says_where() -> None:
    status = {
        "run_id": "r",
        "state": "running",
        "backend": "slurm",
        "slurm_job_id": 7,
        "slurm_state": "RUNNING",
        "node_files": "/scratch/orchestrator-r",
    }
    assert "  the nodes' files: /scratch/orchestrator-r on each node" in status_text(status)
    assert "the nodes' files" not in status_text({**status, "node_files": None})
