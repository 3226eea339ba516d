"""Rendering: a `LaunchPlan` -> one bash script per node (and plan.yaml). Pure.

Templates live in templates/ (package data `orchestrator.templates`). Jinja2 runs with
StrictUndefined; every value that reaches the shell goes through the `q` filter
(`shlex.quote`), and text in comments through `comment` (one line, no control chars).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable
from functools import cache
from importlib import resources
from pathlib import Path

import jinja2
import yaml

from orchestrator.errors import ConfigError
from orchestrator.plan.launch_plan import LaunchPlan, NodePlan
from orchestrator.version import __version__


@cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(resources.files("orchestrator.templates"))),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["q"] = lambda value: shlex.quote(str(value))
    env.filters["qjoin"] = lambda values: " ".join(shlex.quote(str(v)) for v in values)
    env.filters["comment"] = comment_safe
    env.filters["core_words"] = lambda sets: " ".join(s.encode() for s in sets)
    # Shipped as source inside the scripts, so the nodes run these very files: core sets
    # for --bind-cores without a probe, and interface detection on nodes without `ip`.
    env.globals["cores_source"] = _package_source("agent/programs/cores.py")
    env.globals["route_py"] = _package_source("agent/programs/route.py")
    return env


def _package_source(name: str) -> str:
    return resources.files("orchestrator").joinpath(name).read_text(encoding="utf-8")


def render_template(name: str, **context: object) -> str:
    """Render one template with the version in its context."""
    return _environment().get_template(name).render(version=__version__, **context)


def comment_safe(text: object) -> str:
    """Text for a `#` comment: one line, control characters shown as escapes."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def script_name(node: NodePlan) -> str:
    return f"node{node.node_rank}.sh"


def render_node_script(plan: LaunchPlan, node: NodePlan, command: str) -> str:
    """The torchrun script for one node, runnable by hand with `bash nodeN.sh`."""
    return render_template(
        "node.sh.j2", plan=plan, node=node, command=command, script_name=script_name(node)
    )


def render_node_scripts(plan: LaunchPlan, command: str) -> dict[str, str]:
    """Every node's script, by file name (node0.sh, node1.sh, ...)."""
    return {script_name(node): render_node_script(plan, node, command) for node in plan.nodes}


def plan_yaml(plan: LaunchPlan) -> str:
    return yaml.safe_dump(plan.to_dict(), sort_keys=False, width=1000)


def make_output_dir(out_dir: str | Path, option: str = "-o") -> Path:
    """Create the folder rendered files go into (with its parents); return it.

    Raises ConfigError naming `option` and the path when it is not a folder, cannot be
    created, or cannot be written to.
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(
            f"{option} {str(out_dir)!r}: exists and is not a folder; give a folder to write into"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"{option} {str(out_dir)!r}: cannot create this folder: {exc.strerror or exc}"
        ) from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise ConfigError(f"{option} {str(out_dir)!r}: this folder is not writable")
    return out


def write_rendered(out_dir: str | Path, plan: LaunchPlan, scripts: dict[str, str]) -> list[Path]:
    """Write plan.yaml and the node scripts (executable) into out_dir; return the paths."""
    out = make_output_dir(out_dir)
    written = [out / "plan.yaml"]
    written[0].write_text(plan_yaml(plan), encoding="utf-8")
    for name, text in scripts.items():
        path = out / name
        path.write_text(text, encoding="utf-8")
        path.chmod(0o755)
        written.append(path)
    return written


def command_line(argv: Iterable[str], secret_names: Iterable[str] = ()) -> str:
    """The orchestrator command as a shell line, with secret --env values replaced by ***."""
    secrets = set(secret_names)
    shown = []
    for arg in argv:
        prefix = "--env=" if arg.startswith("--env=") else ""
        name, sep, _ = arg[len(prefix) :].partition("=")
        shown.append(f"{prefix}{name}=***" if sep and name in secrets else arg)
    return shlex.join(shown)


def dry_run_text(plan: LaunchPlan, scripts: dict[str, str]) -> str:
    parts = ["# plan.yaml", plan_yaml(plan)]
    for node in plan.nodes:
        parts += [
            f"# ---- {script_name(node)} (runs on {node.name}) ----",
            scripts[script_name(node)],
        ]
    return "\n".join(parts)
