"""The package's shape, as the README's "How it is built" tree states it: layers that import
only downward, no import cycles, modules that fit on a few screens, folders instead of name
prefixes, node-side code on the standard library alone, and every package shipped."""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "orchestrator"
MAX_LINES = 400  # of code: docstrings, comments and blank lines are not counted

# Low to high, one stage a layer: a module may import its own layer and the ones before it,
# never a later one. The package's own modules (errors, hostlist, numerals, sizes) are the
# words every stage shares.
LAYERS: tuple[tuple[str, ...], ...] = (
    # the package itself names the API lazily (by module name, on first use): no import
    (
        "orchestrator",
        "orchestrator.errors",
        "orchestrator.hostlist",
        "orchestrator.numerals",
        "orchestrator.sizes",
        "orchestrator.version",
    ),
    # shipped to the nodes as source and run there on their own: nothing of the package
    ("orchestrator.agent.programs",),
    ("orchestrator.agent",),  # shipped to the nodes as source: the standard library only
    ("orchestrator.options",),  # the option groups: one model of a launch, every stage's input
    ("orchestrator.hosts",),
    ("orchestrator.plan",),
    ("orchestrator.backends",),
    ("orchestrator.record",),
    ("orchestrator.console",),
    ("orchestrator.attempts",),  # what follows an attempt, decided once for every backend
    ("orchestrator.supervise",),
    ("orchestrator.nodes",),
    ("orchestrator.start",),
    ("orchestrator.slurm.batch",),  # the job and its script, pure
    ("orchestrator.slurm.control",),  # SLURM's commands and what they print
    ("orchestrator.slurm.recovery",),  # how a job ended, and the run's next job
    ("orchestrator.slurm.following",),  # following a job to its end
    ("orchestrator.slurm",),  # submitting and attaching
    ("orchestrator.check",),
    ("orchestrator.api",),
    ("orchestrator.cli", "orchestrator.__main__"),
)
# The trainer stands alone: what ranks run imports nothing of the controller.
TRAINER = "orchestrator.trainer"
# Run on the nodes by an interpreter that may have nothing but the standard library.
# The programs first: each imports nothing of the package, not even of the agent.
NODE_SIDE = ("orchestrator.agent.programs", "orchestrator.agent")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def layer_of(name: str) -> int:
    best, found = -1, None
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if within(name, prefix) and len(prefix) > best:
                best, found = len(prefix), index
    if found is None:
        raise AssertionError(f"{name} is in no layer of tests/unit/test_layout.py: place it")
    return found


def imports_of(name: str) -> set[str]:
    """The package modules `name` imports, at module level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(MODULES[name].read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            targets = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            continue
        found |= {t for t in targets if t in MODULES and t != name}
    return found


GRAPH = {name: imports_of(name) for name in MODULES}


def test_every_module_is_placed_and_imports_only_downward() -> None:
    upward = []
    for name, targets in GRAPH.items():
        if within(name, TRAINER):
            outside = sorted(t for t in targets if not within(t, TRAINER))
            assert not outside, f"{name} imports {outside}: the trainer stands alone"
            continue
        for target in targets:
            assert not within(target, TRAINER), f"{name} imports the trainer ({target})"
            if layer_of(target) > layer_of(name):
                upward.append(f"{name} -> {target}")
    assert not upward, f"imports from a lower layer into a higher one: {upward}"


def test_the_command_line_reaches_the_package_through_the_api_alone() -> None:
    """cli/ parses flags, calls the API, prints: it imports orchestrator.api (and the
    option groups its flags are made of, the error types and the version it prints),
    nothing of the stages below."""
    allowed = (
        "orchestrator.api",
        "orchestrator.cli",
        "orchestrator.options",
        "orchestrator.errors",
        "orchestrator.version",
    )
    below = sorted(
        f"{name} -> {target}"
        for name, targets in GRAPH.items()
        if within(name, "orchestrator.cli")
        for target in targets
        if not any(within(target, prefix) for prefix in allowed)
    )
    assert not below, f"cli/ imports past the API: {below}"


def test_no_import_cycles() -> None:
    # A package importing its own submodules (re-exports) is not a cycle.
    edges = {n: {t for t in ts if not within(t, n)} for n, ts in GRAPH.items()}
    state: dict[str, int] = {}

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in sorted(edges[name]):
            if state.get(target) == 1:
                cycle = path[path.index(target) :] + [target]
                pytest.fail(f"import cycle: {' -> '.join(cycle)}")
            if target not in state:
                visit(target, [*path, target])
        state[name] = 2

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(edges)))
    for name in sorted(edges):
        if name not in state:
            visit(name, [name])


def test_node_side_code_needs_the_standard_library_alone() -> None:
    for name, path in MODULES.items():
        if not any(within(name, prefix) for prefix in NODE_SIDE):
            continue
        own = next(prefix for prefix in NODE_SIDE if within(name, prefix))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                roots = [node.module or ""]
            elif isinstance(node, ast.Import):
                roots = [alias.name for alias in node.names]
            else:
                continue
            for root in roots:
                if within(root, own):
                    continue
                top = root.split(".")[0]
                assert top in sys.stdlib_module_names or top == "__future__", (
                    f"{path.relative_to(ROOT)}:{node.lineno} imports {root}: it runs on nodes "
                    f"that have the standard library alone"
                )


def docstring_lines(tree: ast.Module) -> set[int]:
    """The lines of the module's, its classes' and its functions' docstrings."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        first = node.body[0] if node.body else None
        if (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
        ):
            found.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return found


def code_lines(source: str) -> int:
    """Lines that hold code: not blank, not only a comment, not part of a docstring.

    Counting code, not lines, keeps the limit from pressing on what explains the code: a
    module is not split, nor its docstring cut, to make room for words.
    """
    docstrings = docstring_lines(ast.parse(source))
    lines: set[int] = set()
    skipped = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in skipped or token.type == tokenize.ENDMARKER:
            continue
        lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - docstrings)


def test_no_module_is_longer_than_a_few_screens() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in MODULES.values()
        if (n := code_lines(p.read_text(encoding="utf-8"))) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines of code: {long}"


def test_code_lines_leave_out_docstrings_comments_and_blank_lines() -> None:
    source = (
        '"""A module.\n\nWith a long docstring.\n"""\n'
        "\n"
        "# a comment\n"
        "def f(x: int) -> int:\n"
        '    """One line."""\n'
        "    return (x +  # why\n"
        "            1)\n"
        'TEXT = """a string that is\nnot a docstring"""\n'
    )
    assert code_lines(source) == 5


def test_a_name_prefix_is_a_folder() -> None:
    """No `check.py` beside `check_run.py`: a shared prefix asks for a folder `check/`."""
    for folder in [PACKAGE, *(p for p in PACKAGE.rglob("*") if p.is_dir())]:
        names = {
            p.stem
            for p in folder.iterdir()
            if (p.suffix == ".py" or (p / "__init__.py").exists()) and not p.stem.startswith("_")
        }
        clashes = sorted(
            f"{a} / {b}" for a in names for b in names if a != b and b.startswith(a + "_")
        )
        assert not clashes, f"{folder.relative_to(ROOT)}: prefixed siblings {clashes}"


def test_no_two_modules_share_a_name() -> None:
    """`render.py` in two folders makes every traceback, grep and import read ambiguously."""
    seen: dict[str, list[str]] = {}
    for name, path in MODULES.items():
        stem = name.rsplit(".", 1)[-1]
        if path.stem not in ("__init__", "__main__") or path.name == "__init__.py":
            seen.setdefault(stem, []).append(str(path.relative_to(ROOT)))
    twice = {stem: paths for stem, paths in seen.items() if len(paths) > 1}
    assert not twice, f"module or folder names used twice: {twice}"


def test_every_package_is_shipped() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    with open(ROOT / "pyproject.toml", "rb") as file:
        listed = set(tomllib.load(file)["tool"]["setuptools"]["packages"])
    on_disk = {name for name, path in MODULES.items() if path.name == "__init__.py"}
    assert listed - {"orchestrator.templates"} == on_disk, (
        "pyproject.toml's [tool.setuptools] packages must list every package folder"
    )


def test_no_stdlib_name_is_shadowed() -> None:
    """A module named like a standard one (select.py) shadows it for a script run from its
    folder, and the node-side scripts are run that way."""
    clash = sorted(
        str(p.relative_to(ROOT))
        for name, p in MODULES.items()
        if p.stem in sys.stdlib_module_names and p.stem not in ("__init__", "__main__")
    )
    assert not clash, f"modules named like standard library ones: {clash}"


def test_layers_name_only_real_modules() -> None:
    dead = [p for layer in LAYERS for p in layer if p not in MODULES]
    assert not dead, f"tests/unit/test_layout.py names modules that do not exist: {dead}"


# The one module where a launch backend's name may be compared with a word: the registry,
# which turns names into backends (start/launch_backend.py). Everywhere else a backend is
# asked (its methods, its facts in options/backend_facts.py), never named.
BACKEND_REGISTRY = "orchestrator.api.registry"


def names_a_backend(node: ast.expr) -> bool:
    """`backend`, `x.backend`, `x["backend"]` or `x.get("backend")`."""
    if isinstance(node, ast.Name):
        return node.id == "backend"
    if isinstance(node, ast.Attribute):
        return node.attr == "backend"
    if isinstance(node, ast.Subscript):
        key = node.slice
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and node.args
    ):
        key = node.args[0]
    else:
        return False
    return isinstance(key, ast.Constant) and key.value == "backend"


def is_words(node: ast.expr) -> bool:
    """A str literal (plain or f-string), or a tuple, list or set of them."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return bool(node.elts) and all(is_words(element) for element in node.elts)
    if isinstance(node, ast.JoinedStr):
        return True
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def backend_comparisons(source: str) -> list[int]:
    """The lines where something named `backend` is compared with a word or words."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for left, right in zip(operands, operands[1:], strict=False):
            if (names_a_backend(left) and is_words(right)) or (
                names_a_backend(right) and is_words(left)
            ):
                found.append(node.lineno)
                break
    return found


def test_a_backend_is_asked_not_compared_by_name() -> None:
    """`backend == "slurm"` (or `!=`, `in ("ssh", "local")`, `status.get("backend") ==
    "slurm"`) anywhere but the registry scatters what a backend is over its callers: a new
    backend would mean finding every such line. Callers ask the backend object
    (api/registry.py's `backend_named`) or its facts (options/backend_facts.py); the
    collective backend of `check` is asked through check/measure.py's `on_gpus`."""
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for name, path in MODULES.items()
        if name != BACKEND_REGISTRY
        for line in backend_comparisons(path.read_text(encoding="utf-8"))
    ]
    assert not found, f"a backend compared by name outside {BACKEND_REGISTRY}: {found}"


def test_backend_comparisons_are_found_in_every_spelling() -> None:
    source = (
        'if backend == "slurm": pass\n'
        'if run.backend != "ssh": pass\n'
        'if backend in ("ssh", "local"): pass\n'
        'if status.get("backend") == "slurm": pass\n'
        'if "slurm" == status["backend"]: pass\n'
        "if backend == SLURM or facts_of(backend).scheduled: pass\n"
        'if name == "slurm": pass\n'
    )
    assert backend_comparisons(source) == [1, 2, 3, 4, 5]


# The one table from a scheduler's words for a job's state to ours (SchedulerState), with
# the reading of its other state words (sinfo's): the only place such a word is compared.
STATE_TABLE = "orchestrator.slurm.control.parse"


def _is_state(node: ast.expr) -> bool:
    """A state read: `state`, `x.state`, `x.slurm_state`, `x["state"]`, `x.get("state")`."""
    if isinstance(node, ast.Name):
        name = node.id
    elif isinstance(node, ast.Attribute):
        name = node.attr
    elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        name = node.slice.value
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    ):
        name = node.args[0].value
    else:
        return False
    return isinstance(name, str) and (name == "state" or name.endswith("_state"))


def states_compared_as_words(tree: ast.AST) -> list[int]:
    """The lines where a state is compared with a word (==, !=, in, not in, is, <, ...) or
    tested by one (`state.startswith("REQUEUE")`), either side."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(
                (_is_state(a) and is_words(b)) or (is_words(a) and _is_state(b))
                for a, b in zip(sides, sides[1:], strict=False)
            ):
                found.append(node.lineno)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("startswith", "endswith", "count", "find", "index")
            and _is_state(node.func.value)
            and any(is_words(arg) for arg in node.args)
        ):
            found.append(node.lineno)
    return found


def test_no_state_is_compared_as_a_word() -> None:
    """States are enums (RunState, NodePhase, RankPhase, SchedulerState) and decisions name
    their members: nowhere in the package is a state (a name or attribute `state`, one
    ending in `_state`, a mapping's "state" key) compared with a string literal or a
    tuple, list or set of them, nor tested with one (`startswith`), except in the one
    table from SLURM's words to ours (slurm/control/parse.py)."""
    found = [
        f"{MODULES[name].relative_to(ROOT)}:{line}"
        for name in MODULES
        if name != STATE_TABLE
        for line in states_compared_as_words(ast.parse(MODULES[name].read_text(encoding="utf-8")))
    ]
    assert not found, f"states compared as words, not as enum members: {found}"


PROTOCOL = "orchestrator.agent.protocol"
COMMAND_WORDS = ("hb", "stop", "kill", "stacks", "end", "signal", "next")


def _encoders(tree: ast.Module) -> set[str]:
    """The names a module imports from agent/protocol.py (its encoders among them)."""
    return {
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module == PROTOCOL
        for alias in node.names
    }


def _encoded(node: ast.expr, encoders: set[str]) -> bool:
    """A direct call of an encoder imported from agent/protocol.py (or a choice of two)."""
    if isinstance(node, ast.IfExp):
        return _encoded(node.body, encoders) and _encoded(node.orelse, encoders)
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in encoders
        and node.func.id.endswith("_command")
    )


def commands_built_outside_the_protocol(tree: ast.Module, controller: bool = True) -> list[int]:
    """Lines that hand a session a command not made by agent/protocol.py's encoders (on the
    controller's side), or hold a bytes literal that is a command line (`b"next\\n"`)."""
    encoders, found = _encoders(tree), []
    for node in ast.walk(tree):
        if (
            controller
            and isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "send"
            and 1 <= len(node.args) <= 2  # a session's send(line, may_skip=False)
            and not _encoded(node.args[0], encoders)
        ):
            found.append(node.lineno)
        elif isinstance(node, ast.Constant) and isinstance(node.value, bytes):
            word = node.value.split(b" ", 1)[0].split(b"\n", 1)[0]
            if word.decode(errors="replace") in COMMAND_WORDS and node.value != word:
                found.append(node.lineno)
    return found


def test_commands_to_the_agent_are_built_by_the_protocol_alone() -> None:
    """Every command line the controller sends an agent is made by one of agent/protocol.py's
    encoders (`stop_command`, `stacks_command`, ...): outside orchestrator/agent/, the line
    a `send(line)` or `send(line, may_skip)` call is given must be a direct call of a
    `*_command` name imported from agent/protocol.py (or a choice between two such calls),
    so a string built anywhere else, inline or through a variable, fails; and no module
    but agent/protocol.py holds a bytes literal that is a command line (`b"next\\n"`)."""
    found = []
    for name, path in MODULES.items():
        if name == PROTOCOL:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        controller = not within(name, "orchestrator.agent")  # the agent sends frames
        lines = commands_built_outside_the_protocol(tree, controller)
        found += [f"{path.relative_to(ROOT)}:{n}" for n in lines]
    assert not found, f"commands to the agent built outside agent/protocol.py: {found}"


def test_the_state_and_command_rules_catch_what_they_name() -> None:
    def states(source: str) -> int:
        return len(states_compared_as_words(ast.parse(source)))

    def commands(source: str) -> int:
        return len(commands_built_outside_the_protocol(ast.parse(source)))

    assert states('if node.state == "lost": pass') == 1
    assert states('ok = "stopped" != rank.state') == 1
    assert states('x = info.slurm_state in ("RUNNING", "COMPLETING")') == 1
    assert states('x = r.get("state") == "failed" or r["state"] in {"a"}') == 2
    assert states('x = info.state.startswith("REQUEUE")') == 1
    assert states("x = node.state == NodePhase.LOST or state in (RankPhase.FAILED,)") == 0
    assert states('x = kind in ("time-limit", "failed")') == 0  # not a state
    imported = "from orchestrator.agent.protocol import stop_command, kill_command\n"
    assert commands(imported + "s.send(stop_command(3.0))") == 0
    assert commands(imported + "s.send(kill_command() if g <= 0 else stop_command(g))") == 0
    assert commands(imported + 'line = f"stop {g}"\ns.send(line)') == 1
    assert commands(imported + 's.send(f"stop {g}", may_skip=True)') == 1
    assert commands('def stop_command(g): return f"stop {g}"\ns.send(stop_command(2))') == 1
    assert commands(imported + 's.send(kill_command() if g else "kill")') == 1
    assert commands('channel.write(b"next\\n" + config)') == 1
    assert commands("clock.send(run, notes, now, left)") == 0  # not a session's send


def others_attributes_written(source: str) -> list[tuple[int, str]]:
    """The assignments (plain, augmented, annotated; in a tuple too) whose target is an
    attribute of anything but `self` itself: `sup.stopper.wall = `, `self.sup.x = `,
    `node.state = `; `self.x = ` is the object's own. (line, target) each."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        while targets:
            target = targets.pop()
            if isinstance(target, ast.Tuple | ast.List | ast.Starred):
                targets += target.elts if not isinstance(target, ast.Starred) else [target.value]
            elif isinstance(target, ast.Attribute) and not (
                isinstance(target.value, ast.Name) and target.value.id == "self"
            ):
                found.append((target.lineno, ast.unparse(target)))
    return sorted(found)


def test_slurm_writes_no_attribute_but_its_own() -> None:
    """Under SLURM what the scheduler decides itself (srun's kill-on-bad-exit, the job's
    end and how, a signal's name, an interrupt) reaches the supervisor as calls that
    supervise/ owns (`sup.scheduler_stopped(...)`, `deadline.signal_known(...)`), never
    as writes into its parts: in orchestrator/slurm/ an assignment writes only `self.NAME`;
    anything else's state changes through its own methods."""
    written = {
        f"{path.relative_to(ROOT)}:{line}": target
        for name, path in MODULES.items()
        if within(name, "orchestrator.slurm")
        for line, target in others_attributes_written(path.read_text(encoding="utf-8"))
    }
    assert not written, f"attributes of other objects written in orchestrator/slurm/: {written}"


def test_the_slurm_rule_finds_writes_into_other_objects() -> None:
    source = (
        "def f(self, sup, node):\n"
        "    self.x = 1\n"
        "    sup.stopper.wall = 2\n"
        "    self.sup.y, node.state = 3, 'failed'\n"
        "    node.count += 1\n"
        "    self.z: int = 4\n"
    )
    assert others_attributes_written(source) == [
        (3, "sup.stopper.wall"),
        (4, "node.state"),
        (4, "self.sup.y"),
        (5, "node.count"),
    ]


def test_every_package_docstring_names_each_of_its_files() -> None:
    """A folder's __init__.py says what each of its files holds: its docstring names every
    module (`name.py`) and every folder of modules (`name/`) beside it."""
    unnamed = {}
    for init in sorted(PACKAGE.rglob("__init__.py")):
        folder = init.parent
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        entries = [p.name for p in folder.glob("*.py") if p.name != "__init__.py"]
        entries += [
            f"{p.name}/"
            for p in folder.iterdir()
            if p.is_dir() and p.name != "__pycache__" and any(p.glob("*.py"))
        ]
        missing = sorted(
            name for name in entries if not re.search(rf"(?<![\w/]){re.escape(name)}", doc)
        )
        if missing:
            unnamed[str(init.relative_to(ROOT))] = missing
    assert not unnamed, f"package docstrings that do not name each of their files: {unnamed}"
