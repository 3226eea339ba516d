"""What `launch` and `render` share beyond the option groups: telling a HOSTFILE from a
program that came after `--`."""

from __future__ import annotations

import click


class HostfileOptional(click.Command):
    """Keeps the raw arguments, to tell `launch -- train.py` (no HOSTFILE) from
    `launch hosts.txt -- train.py`: click drops the `--` itself."""

    def parse_args(self, ctx, args):
        ctx.meta["raw_args"] = list(args)
        return super().parse_args(ctx, args)


def split_hostfile(hostfile: str | None, program: tuple[str, ...]):
    """A first positional argument that came after `--` is the program, not a HOSTFILE."""
    raw = click.get_current_context().meta.get("raw_args", [])
    if hostfile is not None and "--" in raw and hostfile not in raw[: raw.index("--")]:
        return None, (hostfile, *program)
    return hostfile, program
