"""The parts of `exec --run RUN` that need no SLURM (orchestrator.slurm.control.exec_step): srun's
command line, the wrapper each task runs (run here by bash), srun's `--label` output read
back to the nodes, the results and the refusals of what has no running job. The whole path
runs against the lab's SLURM in tests/cluster/test_slurm_exec_cluster.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.errors import ConfigError
from orchestrator.nodes.execute import results_table
from orchestrator.record.runs import RunRecord, new_status
from orchestrator.slurm.control.exec_step import (
    StepOutput,
    check_running,
    job_of,
    step_argv,
    step_results,
)
from orchestrator.slurm.control.parse import JobInfo

TAG = "orchestrator-exec-0123456789abcdef"
NASTY = """echo "a  b" '$HOME'; printf 'no newline'"""


def test_srun_runs_one_task_per_node_of_the_job_with_the_command_as_one_argument() -> None:
    argv = step_argv(42, 3, TAG, NASTY)
    assert argv[:10] == [
        "srun",
        "--overlap",
        "--jobid=42",
        "--nodes=3",
        "--ntasks=3",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=0",
        "--quiet",
        "--label",
        f"--job-name={TAG}",
    ]
    assert "--unbuffered" not in argv  # whole lines, never two nodes' halves on one
    assert argv[10:12] == ["bash", "-c"] and argv[-2:] == [TAG, NASTY]
    assert NASTY not in argv[12] and TAG not in argv[12]  # arguments, not script text


def test_the_wrapper_names_the_node_and_ends_with_the_commands_exit_status() -> None:
    wrapper = step_argv(1, 1, TAG, NASTY + "; exit 4")[10:]
    done = subprocess.run(
        wrapper, capture_output=True, env={"SLURMD_NODENAME": "gpu7", "PATH": "/usr/bin:/bin"}
    )
    assert done.returncode == 4
    assert done.stdout.decode().splitlines() == [
        f"{TAG} node gpu7",
        "a  b $HOME",
        f"no newline{TAG} exit 4",
    ]


def test_label_output_goes_to_the_node_each_task_named_whatever_the_task_order() -> None:
    reader = StepOutput(TAG, ["n0", "n1"])
    lines = reader.feed(f"0: {TAG} node n1\n1: {TAG} node n0\n0: on n".encode())
    lines += reader.feed(b"1\n1: on n0\nsrun: warning: something of srun's own\n")
    lines += reader.feed(f"0: half{TAG} exit 0\n1: {TAG} exit 3\n".encode())
    lines += reader.feed(b"srun: error: n0: task 1: Exited with exit code 3\n0: tail")
    lines += reader.end()
    assert lines == [
        (1, b"on n1\n"),
        (0, b"on n0\n"),
        (None, b"srun: warning: something of srun's own\n"),
        (1, b"half\n"),
        (1, b"tail\n"),
    ]
    assert reader.codes == {1: 0, 0: 3}


def test_wide_labels_empty_lines_and_slurms_own_step_end() -> None:
    hosts = [f"n{i}" for i in range(12)]
    reader = StepOutput(TAG, hosts)
    lines = reader.feed(f" 3: \n11: x\n 3: {TAG} node n9\n 3: y\n".encode())
    lines += reader.feed(b" 3: slurmstepd-n9: error: *** STEP 1.5 ON n9 CANCELLED AT now ***\n")
    assert lines == [
        (3, b"\n"),  # before its node line: the task's number is its node (block layout)
        (11, b"x\n"),
        (9, b"y\n"),
        (None, b"slurmstepd-n9: error: *** STEP 1.5 ON n9 CANCELLED AT now ***\n"),
    ]


def test_results_say_which_node_failed_and_why_there_is_no_status() -> None:
    outputs = {0: [b"fine\n"], 1: [b"bad\n"]}
    results = step_results(["n0", "n1", "n2"], {0: 0, 1: 3}, outputs, srun_code=1)
    assert [(r.host, r.state, r.exit_code, r.output) for r in results] == [
        ("n0", "succeeded", 0, "fine\n"),
        ("n1", "failed", 3, "bad\n"),
        ("n2", "lost", None, ""),
    ]
    table = results_table(results).splitlines()
    assert table[2].split() == ["n1", "exit", "code", "3"]
    assert table[3] == "n2  lost: no exit status came back (srun exited with 1)"
    assert table[-1] == "1 of 3 node(s) succeeded"
    timed = step_results(["n0", "n1"], {0: 0}, {}, "time limit reached", srun_code=143)
    assert timed[1].state == "stopped" and timed[1].describe().startswith("time limit reached")


def record_of(tmp_path: Path, backend: str, **fields) -> RunRecord:
    record = RunRecord.create(tmp_path / "runs", "r1")
    status = new_status("r1", backend, "orchestrator launch", "train.py", 2, 2, "n0:29500")
    record.write_status({**status, **fields})
    return record


@pytest.mark.parametrize(
    ("backend", "fields", "says"),
    [
        ("ssh", {"nodes": [{"host": "a"}, {"host": "b"}]}, r"an SSH run \(nodes: a, b\).*HOSTFILE"),
        ("local", {}, r"a local run .*`orchestrator exec HOSTFILE -- COMMAND`"),
        ("slurm", {"slurm_job_id": 7, "slurm_login": "login1"}, r"submitted on login1 .*run on"),
        ("slurm", {"slurm_job_id": 7, "state": "stopped"}, r"run r1 has ended \(stopped\)"),
        ("slurm", {"slurm_job_id": None, "state": "starting"}, r"no SLURM job yet \(state start"),
    ],
)
def test_a_run_without_a_running_job_of_its_own_here_is_refused(
    tmp_path: Path, backend: str, fields: dict, says: str
) -> None:
    record = record_of(tmp_path, backend, **fields)
    with pytest.raises(ConfigError, match=says) as info:
        job_of(record, record.read_status())
    assert info.value.exit_code == 2


def test_a_slurm_run_with_its_job_is_that_job(tmp_path: Path) -> None:
    record = record_of(tmp_path, "slurm", slurm_job_id=7, state="running", slurm_login=None)
    assert job_of(record, record.read_status()) == 7


@pytest.mark.parametrize(
    ("info", "says"),
    [
        (JobInfo("PENDING", "Priority"), r"job 7 is queued \(PENDING, reason Priority\)"),
        (JobInfo("COMPLETING"), r"job 7 is COMPLETING, not running"),
        (JobInfo("CANCELLED", source="sacct"), r"job 7 has ended \(CANCELLED\)"),
    ],
)
def test_only_a_running_job_has_nodes_to_use(info: JobInfo, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        check_running("r1", 7, info)
    check_running("r1", 7, JobInfo("RUNNING", "None", "n[0-1]"))


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--", "hostname"], "exec needs the nodes: a HOSTFILE"),
        (["hosts.txt", "--run", "r1", "--", "hostname"], "not both (HOSTFILE hosts.txt, --run r1)"),
        (["--run", "r1"], "no COMMAND; give it after `--`"),
        (["--run", "r1", "--identity", "key", "--", "hostname"], "--identity cannot be used here"),
        (["hosts.txt", "--run-dir", "x", "--", "hostname"], "--run-dir cannot be used here"),
        (["--run", "r1", "--run-dir", "nowhere", "--", "hostname"], "no run 'r1' in nowhere"),
    ],
)
def test_exec_takes_a_hostfile_or_a_run_and_says_so(tmp_path, capsys, monkeypatch, args, says):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(["exec", *args])
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    assert says in err and "Traceback" not in err


def test_the_api_takes_execs_run_flags_only_and_refuses_as_the_command_line(
    tmp_path: Path,
) -> None:
    import orchestrator

    runs = tmp_path / "runs"
    with pytest.raises(ConfigError, match=r"no keyword 'ssh_config'; .*color, fold, grace"):
        orchestrator.exec_on_run("r1", "true", run_dir=runs, ssh_config="x")
    with pytest.raises(ConfigError, match="--timeout must be 0 or more"):
        orchestrator.exec_on_run("r1", "true", run_dir=runs, timeout=-1)
    record_of(tmp_path, "ssh", nodes=[{"host": "a"}])
    with pytest.raises(ConfigError, match=r"run r1 is an SSH run .*give the hostfile"):
        orchestrator.exec_on_run("r1", "true", run_dir=runs, grace=1.0)
