"""A run's goodput in words, from status.json's `goodput` (record/goodput/phases.py): the run's
last line and the short table `orchestrator status` shows. Both read the same rounded
figures, so the line, the table and the record never disagree."""

from __future__ import annotations

from orchestrator.record.goodput.phases import PHASES

WORDS = {  # phase -> its name in the table
    "waiting": "waiting",
    "starting": "starting",
    "training": "training kept",
    "redone": "training redone",
    "checkpoints": "checkpoint saves",
    "detecting": "detecting faults",
    "stopping": "stopping",
    "fewer_nodes": "fewer nodes",
    "running": "running (no steps)",
}


def duration(seconds: float) -> str:
    """A duration as the line says it: 4.2 s, 38 s, 3 min 12 s, 2 h 5 min."""
    if seconds < 9.95:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        minutes, rest = divmod(whole, 60)
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    hours, rest = divmod(whole, 3600)
    return f"{hours} h {rest // 60} min"


def percent(ratio: float) -> str:
    return f"{ratio * 100:.0f} %"


def goodput_line(goodput: dict) -> str:
    """The run's last line: `goodput 91 %: 4 min lost to 1 fault (detect 10 s, restart
    38 s, redone 3 min)`; without faults, where the rest of the wall time went; without
    steps, that it could not be measured."""
    phases, wall = goodput["phases"], goodput["wall_s"]
    others = [
        f"{WORDS[name]} {duration(phases[name])}"
        for name in PHASES
        if name not in ("training", "running") and phases.get(name, 0) >= 0.05
    ]
    if not goodput["steps"]:
        return (
            f"goodput not measured: the program reported no steps (no metrics channel); "
            f"of {duration(wall)}: running {duration(phases['running'])}"
            + "".join(f", {part}" for part in others)
        )
    head = f"goodput {percent(goodput['ratio'])}"
    faults = goodput["faults"]
    if faults["count"]:
        lost = faults["detect_s"] + faults["restart_s"] + faults["redone_s"]
        return (
            f"{head}: {duration(lost)} lost to {causes(faults)} (detect "
            f"{duration(faults['detect_s'])}, restart {duration(faults['restart_s'])}, redone "
            f"{duration(faults['redone_s'])}; {goodput['redone_steps']} step(s) redone)"
        )
    rest = f" ({', '.join(others)})" if others else ""
    return f"{head}: training {duration(phases['training'])} kept of {duration(wall)}{rest}"


def causes(faults: dict) -> str:
    """`1 fault`, `1 slow node swapped`, `2 faults and 1 slow node swapped`."""
    swaps = sum(1 for fault in faults.get("each") or [] if fault.get("event") == "swap")
    rest = faults["count"] - swaps
    said = [f"{rest} fault{'s' if rest != 1 else ''}"] if rest else []
    if swaps:
        said.append(f"{swaps} slow node{'s' if swaps != 1 else ''} swapped")
    return " and ".join(said)


def goodput_table(goodput: dict) -> list[str]:
    """`status`'s lines: the ratio, then seconds per phase, per attempt and in total."""
    attempts = goodput.get("attempts") or []
    heads = ["PHASE", *(f"ATTEMPT {a['attempt']}" for a in attempts if len(attempts) > 1)]
    rows = [[*heads, "TOTAL", "SHARE"]]
    wall = goodput["wall_s"]
    for name in PHASES:
        total = goodput["phases"].get(name, 0.0)
        if total < 0.05 and name != "training":
            continue
        row = [WORDS[name]]
        if len(attempts) > 1:
            row += [f"{a['phases'].get(name, 0.0):.1f}" for a in attempts]
        share = f"{total / wall * 100:.1f} %" if wall > 0 else "-"
        rows.append([*row, f"{total:.1f}", share])
    rows.append(["wall", *(f"{a['wall_s']:.1f}" for a in attempts if len(attempts) > 1)])
    rows[-1] += [f"{wall:.1f}", "100.0 %"]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]

    def aligned(row: list[str]) -> str:  # names to the left, figures to the right
        cells = zip(row, widths, strict=True)
        return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(cells))

    table = [aligned(row) for row in rows]
    return [f"  {goodput_line(goodput)}", *(f"    {line.rstrip()}" for line in table)]
