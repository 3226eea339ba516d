"""Runs first on a node: makes the agent's modules, shipped as source, importable.

The controller sends this file followed by one call of `install` with every module of the
agent as (name, source) in dependency order (see orchestrator.agent.bootstrap). Each is
executed as a module of that name in sys.modules, its parent packages as empty modules, so
the modules import each other on the node exactly as they do in the package: nothing is
installed there, and nothing is written to its disk.

Standard library only, and nothing beyond `sys`: this is part of every agent's start-up.
"""

from __future__ import annotations

import sys


def install(modules: list[tuple[str, str]]) -> object:
    """Execute each (name, source) as module `name`; returns the last one."""
    module = None
    for name, source in modules:
        parent = ""
        for part in name.split(".")[:-1]:
            package = f"{parent}.{part}" if parent else part
            if package not in sys.modules:
                sys.modules[package] = new_module(package, [])
                if parent:
                    setattr(sys.modules[parent], part, sys.modules[package])
            parent = package
        module = new_module(name)
        sys.modules[name] = module
        if parent:
            setattr(sys.modules[parent], name.rpartition(".")[2], module)
        exec(compile(source, name.replace(".", "/") + ".py", "exec"), module.__dict__)
    return module


def new_module(name: str, path: list[str] | None = None) -> object:
    module = type(sys)(name)
    if path is not None:  # a package: its submodules come from sys.modules only
        module.__path__ = path
    return module
