"""Runs first on a node: makes the agent's modules importable, from code or from source.

BOOTSTRAP executes this file followed by `sys.exit(install(read_modules(read_exact)).main())`
(see orchestrator.agent.bootstrap). The controller then sends the agent's modules twice, as
(name, code) compiled by its own interpreter and as (name, source); `read_modules` keeps the
compiled ones when this interpreter reads the same bytecode (its magic number matches) and
else the source, which this interpreter compiles. Compiling costs a node more than the rest
of the agent's start-up together (23 of the 112 ms of CPU a whole `exec` step cost here).

Each module is executed as a module of that name in sys.modules, its parent packages as
empty modules, so the modules import each other on the node exactly as they do in the
package: nothing is installed there, and nothing is written to its disk.

Standard library only, and only modules built into every interpreter (sys, marshal): this
is part of every agent's start-up.
"""

from __future__ import annotations

import marshal
import sys

# Type names only, not imported at run time (see processes.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable


def bytecode_magic() -> bytes | None:
    """This interpreter's bytecode magic number, from the import system already loaded."""
    return getattr(sys.modules.get("_frozen_importlib_external"), "MAGIC_NUMBER", None)


def read_modules(read_exact: Callable[[int], bytes]) -> list[tuple[str, object]]:
    """The agent's modules as sent after this file: (name, code) where this interpreter
    can run the controller's bytecode, else (name, source)."""
    magic, compiled, sources = (read_exact(int(read_exact(8))) for _ in range(3))
    own = bytecode_magic()
    return marshal.loads(compiled if own is not None and magic == own else sources)


def install(modules: list[tuple[str, object]]) -> object:
    """Execute each (name, code or source) as module `name`; returns the last one."""
    module = None
    for name, code in modules:
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
        exec(compile_module(name, code) if isinstance(code, str) else code, module.__dict__)
    return module


def compile_module(name: str, source: str) -> object:
    """A module's code as the controller compiles it and as a node compiles its source."""
    return compile(source, name.replace(".", "/") + ".py", "exec", dont_inherit=True, optimize=0)


def new_module(name: str, path: list[str] | None = None) -> object:
    module = type(sys)(name)
    if path is not None:  # a package: its submodules come from sys.modules only
        module.__path__ = path
    return module
