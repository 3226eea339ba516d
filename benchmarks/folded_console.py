"""The folded console: a job whose ranks all print the same line, folded vs --no-fold.

    python benchmarks/folded_console.py [--nodes 64] [--ranks-per-node 2] [--runs LIST]
    (as root: it builds a namespace cluster of N nodes with sshd, tests/lab)

Every rank prints "hello from a rank" and exits. `orchestrator launch` runs on a
pseudo-terminal, as at a desk, with --color never; the baseline is the same launch with
--no-fold, in the same run, on the same cluster; a third run pipes the folded console into
a file (as a CI log would). Counted: the lines the console shows in all (the live progress
line, rewritten in place and cleared, is not one), the lines saying hello and the ranks
they name (folded ones expanded), and whether every rank file holds its line whole. Passes
when the folded console names every rank once, shows at most 25 lines in all on the
terminal, --no-fold shows one hello line per rank, and every rank file is whole. The nodes
log in with a home whose shell start-up files are empty (root's own ~/.bashrc may run pyenv
on every SSH session: at 256 nodes their queue on pyenv's lock failed the preflight).
"""

from __future__ import annotations

import re
import subprocess
import time

from common import ORCHESTRATOR, lab_cluster, machine_line, parser, say, scratch, table

from tests.cli_helpers import run_on_terminal

HELLO = "hello from a rank"
PROGRAM = f"print({HELLO!r}, flush=True)\n"
MOST_LINES = 25
SHOWN = re.compile(r"\[(\S+?)(?: (r\S+))?\] " + re.escape(HELLO))


def console_lines(text: str) -> list[str]:
    """What a terminal shows at the end: each line as last drawn; cleared lines are gone."""
    shown = []
    for line in text.replace("\r\n", "\n").split("\n"):
        line = line.split("\r\x1b[K")[-1]
        if line.strip():
            shown.append(line)
    return shown


def ranks_named(lines: list[str]) -> list[int]:
    from orchestrator.hostlist import expand_range

    ranks = []
    for line in lines:
        match = SHOWN.fullmatch(line)
        if match is not None and match.group(2):
            ranks += [int(name[1:]) for name in expand_range(match.group(2))]
    return sorted(ranks)


RUNS = {
    "folded": ("folded, terminal", [], True),
    "no-fold": ("--no-fold, terminal", ["--no-fold"], True),
    "piped": ("folded, piped", [], False),
}


def measure(n: int, per_node: int, timeout: float, runs: list[str]) -> bool:
    world = n * per_node
    rows, verdicts = [], []
    with (
        scratch("orchestrator-bench-fold-") as work,
        lab_cluster(n, plain_home=work / "home", apart=True) as cluster,
    ):
        say(f"\n{n} node(s), {per_node} rank(s) each ({world} ranks); {machine_line()}")
        (work / "hello.py").write_text(PROGRAM)
        hostfile = cluster.write_hostfile(work / "hosts.txt", slots=per_node)
        env = cluster.environ()
        base = [*ORCHESTRATOR, "launch", str(hostfile), "--run-dir", str(work / "runs")]
        base += ["--color", "never"]
        for name, extra, tty in (RUNS[run] for run in runs):
            run_id = f"fold-{len(rows)}"
            argv = [*base, "--run-id", run_id, *extra, "--", "hello.py"]
            start = time.monotonic()
            if tty:
                code, raw = run_on_terminal(argv, cwd=work, env=env, timeout=timeout)
                text = raw.decode(errors="replace")
            else:
                done = subprocess.run(
                    argv, cwd=work, env=env, capture_output=True, text=True, timeout=timeout
                )
                code, text = done.returncode, done.stdout + done.stderr
            took = time.monotonic() - start
            lines = console_lines(text)
            hello = [line for line in lines if SHOWN.fullmatch(line)]
            named = ranks_named(hello)
            logs = work / "runs" / run_id / "logs"
            whole = all(
                (logs / f"rank-{r}.log").exists()
                and (logs / f"rank-{r}.log").read_text() == HELLO + "\n"
                for r in range(world)
            )
            every = named == list(range(world))
            rows.append([name, code, len(lines), len(hello), f"{len(set(named))}/{world}"])
            rows[-1] += ["yes" if whole else "NO", f"{took:.0f}"]
            if name.startswith("folded, terminal"):
                verdicts.append(code == 0 and every and len(lines) <= MOST_LINES and whole)
                say("  folded console, as shown:\n    " + "\n    ".join(lines))
            elif name.startswith("--no-fold"):
                verdicts.append(code == 0 and len(hello) == world and every and whole)
            else:
                verdicts.append(code == 0 and every and whole)
            if not verdicts[-1] and not name.startswith("folded, terminal"):
                say(
                    f"  {name} failed (exit {code}); its last lines:\n    "
                    + "\n    ".join(lines[-12:])
                )
    headers = ["console", "exit", "lines in all", "hello lines", "ranks named", "files whole"]
    say(table([*headers, "s"], rows))
    shown = {row[0]: row[2] for row in rows}
    folded, unfolded = shown["folded, terminal"], shown.get("--no-fold, terminal")
    passed = all(verdicts)
    versus = "" if unfolded is None else f", --no-fold {unfolded} ({folded / unfolded:.2f}x)"
    say(
        f"{n} nodes: {'PASS' if passed else 'FAIL'}: the folded terminal showed {folded} "
        f"line(s) in all (at most {MOST_LINES}){versus}"
    )
    return passed


def main() -> int:
    cli = parser(__doc__.splitlines()[0], "64", 1)
    cli.add_argument("--ranks-per-node", type=int, default=2, help="ranks per node (2)")
    cli.add_argument("--timeout", type=float, default=1800, help="seconds a launch may take")
    cli.add_argument(
        "--runs",
        default="folded,no-fold,piped",
        help="which launches, in order (folded,no-fold,piped; folded is always run; at 256 "
        "nodes each launch takes ~18 minutes here)",
    )
    args = cli.parse_args()
    runs = ["folded"] + [run for run in args.runs.split(",") if run != "folded"]
    unknown = sorted(set(runs) - set(RUNS))
    if unknown:
        cli.error(f"--runs: unknown {', '.join(unknown)} (choose from {', '.join(RUNS)})")
    say(__doc__.split("\n\n", 2)[2].rstrip())
    results = [measure(n, args.ranks_per_node, args.timeout, runs) for n in args.nodes]
    return 0 if all(results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
