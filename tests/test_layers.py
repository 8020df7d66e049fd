"""Imports go down only: each package of ``tuner`` and the service may import the packages
below it and nothing above (``cli`` and ``worker`` may use everything beneath them; the
core imports nothing of ours), nothing under ``tuner/`` imports the service (``api``), no
test imports the benchmarks (``bench``), and no two modules import each other, however
indirectly. Checked on the source with ``ast``, lazy imports inside functions and
``TYPE_CHECKING`` blocks included, so a forbidden import fails here even when no test
happens to execute it."""

from __future__ import annotations

import ast
import functools
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT

# What each package may import besides itself. ``api`` is the service: it stands on the
# core and the answer (both torch-free; it never imports torch). The client and the worker
# speak the wire contract of the core (``tuner.core.wire``); what the service adds to them
# (the in-process store, the ``serve``, ``token`` and ``db`` commands) they find through
# entry points, never by import.
MAY_IMPORT: dict[str, frozenset[str]] = {
    "tuner.core": frozenset(),
    "tuner.answer": frozenset({"tuner.core"}),
    "tuner.engine": frozenset({"tuner.core"}),
    "tuner.hf": frozenset({"tuner.core", "tuner.engine"}),
    "api": frozenset({"tuner.core", "tuner.answer"}),
    "tuner.client": frozenset({"tuner.core"}),
    "tuner.train": frozenset({"tuner.core", "tuner.answer", "tuner.engine", "tuner.client"}),
    "tuner.worker": frozenset({"tuner.core", "tuner.engine", "tuner.client"}),
    "tuner.cli": frozenset(
        {
            "tuner.core",
            "tuner.answer",
            "tuner.engine",
            "tuner.client",
            "tuner.train",
            "tuner.worker",
        }
    ),
}
# The package root re-exports the public API from every role; nothing inside may import it.
FACADE = "tuner"
OURS = ("tuner", "api", "examples", "bench", "tests", "migrations")


def layer_of(module: str) -> str | None:
    """The package of ``MAY_IMPORT`` that ``module`` belongs to (``None`` for the root)."""
    for layer in MAY_IMPORT:
        if module == layer or module.startswith(layer + "."):
            return layer
    return None


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[int, str]]:
    """Every module ``tree`` imports, relative imports resolved against ``module``."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from tuner.engine import probe`` imports tuner.engine.probe: judge the names too.
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}" if base else alias.name


@functools.cache
def _imports_in(source: str, module: str, is_package: bool) -> tuple[tuple[int, str], ...]:
    """``_imported`` of a module's source, parsed once per source text: the tests below
    check copies of the whole tree that differ from it by one file, and walking every
    module's syntax tree again for each of them was most of their time."""
    return tuple(_imported(ast.parse(source), module, is_package))


def _imports_of_file(path: Path, module: str) -> tuple[tuple[int, str], ...]:
    return _imports_in(path.read_text(), module, path.name == "__init__.py")


def violations(root: Path) -> list[str]:
    """One line per forbidden import in the ``tuner`` and ``api`` packages under ``root``."""
    found = []
    for path in sorted([*root.glob("tuner/**/*.py"), *root.glob("api/**/*.py")]):
        module = _module_name(path, root)
        layer = layer_of(module)
        if layer is None:
            continue  # the facade itself
        for line, target in _imports_of_file(path, module):
            if target.split(".")[0] not in OURS:
                continue
            target_layer = layer_of(target)
            if target_layer == layer or target_layer in MAY_IMPORT[layer]:
                continue
            # Outside every package: the root facade (``tuner``, ``tuner.Name``) or a tree
            # that is no part of the product (examples, tests, ...).
            what = target_layer or ("the package root" if target.startswith(FACADE) else target)
            found.append(f"{path.relative_to(root)}:{line}: {layer} imports {target} ({what})")
    return found


def imports_of(root: Path, package: str, forbidden: str) -> list[tuple[str, str]]:
    """``(file:line, what)`` for each import of ``forbidden`` (a top-level package) in a
    module under ``root / package``, wherever it stands in the module."""
    found = []
    for path in sorted((root / package).glob("**/*.py")):
        module = _module_name(path, root)
        for line, target in _imports_of_file(path, module):
            if target.partition(".")[0] == forbidden:
                found.append((f"{path.relative_to(root)}:{line}", target))
    return found


def service_imports(root: Path) -> list[str]:
    """One line per import of the service (``api``) under ``root / "tuner"``."""
    return [f"{where}: imports {target}" for where, target in imports_of(root, "tuner", "api")]


def bench_imports(root: Path) -> list[str]:
    """One line per import of the benchmarks (``bench``) under ``root / "tests"``."""
    return [f"{where}: imports {target}" for where, target in imports_of(root, "tests", "bench")]


# Where import circles are looked for: the product and the benchmarks beside it.
CYCLE_ROOTS = ("tuner", "api", "bench")


def import_graph(root: Path) -> dict[str, dict[str, int]]:
    """Each module under ``CYCLE_ROOTS`` → the modules of ours it imports, with a line.

    ``from a.b import c`` names the module ``a.b.c`` when there is one, else ``a.b`` (``c``
    is a name inside it). Importing ``a.b.c`` also runs the package ``a.b``'s
    ``__init__``, but that is not counted as an import of it: a package that re-exports its
    modules would otherwise be a circle with each of them.
    """
    paths = {
        _module_name(path, root): path
        for package in CYCLE_ROOTS
        for path in sorted(root.glob(f"{package}/**/*.py"))
    }
    graph: dict[str, dict[str, int]] = {}
    for module, path in paths.items():
        edges = graph.setdefault(module, {})
        for line, target in _imports_of_file(path, module):
            while target and target not in paths:
                target = target.rpartition(".")[0]
            if target and target != module:
                edges.setdefault(target, line)
    return graph


def import_cycles(root: Path) -> list[str]:
    """One line per circle (a strongly connected set of two or more modules), naming its
    modules and every import that closes it, with file and line."""
    graph = import_graph(root)
    order: dict[str, int] = {}
    lowest: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan's strongly connected components
        order[module] = lowest[module] = len(order)
        stack.append(module)
        for target in graph[module]:
            if target not in order:
                visit(target)
                lowest[module] = min(lowest[module], lowest[target])
            elif target in stack:
                lowest[module] = min(lowest[module], order[target])
        if lowest[module] == order[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in graph:
        if module not in order:
            visit(module)
    found = []
    for circle in sorted(circles):
        imports = [
            f"{source.replace('.', '/')}.py:{line} imports {target}"
            for source in circle
            for target, line in sorted(graph[source].items())
            if target in circle
        ]
        found.append(f"{' <-> '.join(circle)} import each other: {'; '.join(imports)}")
    return found


@pytest.mark.slow
def test_no_package_imports_one_above_it() -> None:
    assert violations(REPO_ROOT) == []


def test_nothing_under_tuner_imports_the_service() -> None:
    found = service_imports(REPO_ROOT)
    assert found == [], "\n".join(found)


@pytest.mark.slow
def test_no_test_imports_the_benchmarks() -> None:
    found = bench_imports(REPO_ROOT)
    assert found == [], "a check that needs bench/ belongs to the benchmark that runs it:\n" + (
        "\n".join(found)
    )


@pytest.mark.slow
def test_no_modules_import_each_other() -> None:
    circles = import_cycles(REPO_ROOT)
    assert circles == [], "\n".join(circles)


def test_every_module_belongs_to_a_package() -> None:
    loose = [path.name for path in (REPO_ROOT / "tuner").glob("*.py") if path.name != "__init__.py"]
    assert loose == [], "modules beside tuner/__init__.py belong in one of the role packages"


@pytest.fixture
def tree_copy(tmp_path: Path) -> Path:
    for package in ("tuner", "api"):
        shutil.copytree(
            REPO_ROOT / package,
            tmp_path / package,
            ignore=shutil.ignore_patterns("__pycache__", "static", "templates", "migrations"),
        )
    return tmp_path


@pytest.mark.slow
@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        (
            "tuner/core/leak.py",
            "from tuner.engine import probe\n",
            "tuner.core imports tuner.engine.probe",
        ),
        (
            "tuner/core/leak.py",
            "import torch\nimport tuner.client\n",
            "tuner.core imports tuner.client",
        ),
        (
            "tuner/engine/leak.py",
            "def later():\n    from tuner.client import TunerClient\n",
            "tuner.engine imports tuner.client.TunerClient",
        ),
        (
            "tuner/engine/leak.py",
            "import typing\nif typing.TYPE_CHECKING:\n    from tuner.train import accumulate\n",
            "tuner.engine imports tuner.train.accumulate",
        ),
        ("tuner/train/leak.py", "from ..cli import main\n", "tuner.train imports tuner.cli.main"),
        (
            "tuner/client/leak.py",
            "from tuner import Workload\n",
            "imports tuner.Workload (the package root)",
        ),
        (
            "api/leak.py",
            "from tuner.engine.probe import run_probe\n",
            "api imports tuner.engine.probe",
        ),
        (
            "tuner/client/leak.py",
            "def later():\n    from api.service import recommend\n",
            "tuner.client imports api.service.recommend",
        ),
        ("tuner/cli/leak.py", "import api.main\n", "tuner.cli imports api.main"),
    ],
)
def test_an_upward_import_in_a_temporary_module_is_found(
    tree_copy: Path, module: str, source: str, expected: str
) -> None:
    assert violations(tree_copy) == []
    (tree_copy / module).write_text(source)
    found = violations(tree_copy)
    assert len(found) == 1, found
    assert found[0].startswith(f"{module}:")
    assert expected in found[0]


@pytest.mark.parametrize(
    ("sources", "expected"),
    [
        (
            {
                "tuner/engine/first.py": "from tuner.engine.second import b\n",
                "tuner/engine/second.py": "def b():\n    from tuner.engine import first\n",
            },
            "tuner.engine.first <-> tuner.engine.second import each other: "
            "tuner/engine/first.py:1 imports tuner.engine.second; "
            "tuner/engine/second.py:2 imports tuner.engine.first",
        ),
        (
            {
                "api/one.py": "import api.two\n",
                "api/two.py": "from . import three\n",
                "api/three.py": (
                    "import typing\nif typing.TYPE_CHECKING:\n    from api.one import x\n"
                ),
            },
            "api.one <-> api.three <-> api.two import each other",
        ),
    ],
)
def test_modules_that_import_each_other_are_found(
    tree_copy: Path, sources: dict[str, str], expected: str
) -> None:
    assert import_cycles(tree_copy) == []
    for module, source in sources.items():
        (tree_copy / module).write_text(source)
    found = import_cycles(tree_copy)
    assert len(found) == 1, found
    assert found[0].startswith(expected)


def test_a_module_importing_its_own_package_is_no_circle(tree_copy: Path) -> None:
    (tree_copy / "tuner/engine/fine.py").write_text("from tuner.engine import probe\n")
    (tree_copy / "tuner/engine/__init__.py").write_text("from tuner.engine.fine import x\n")
    assert import_cycles(tree_copy) == []


def test_downward_and_relative_imports_inside_a_package_are_allowed(tree_copy: Path) -> None:
    (tree_copy / "tuner/train/fine.py").write_text(
        "from tuner.core import plan\nfrom tuner.engine import probe\nfrom . import accumulate\n"
    )
    (tree_copy / "tuner/cli/fine.py").write_text("from tuner.worker import loop\n")
    assert violations(tree_copy) == []


@pytest.mark.parametrize(
    "source",
    [
        "import api\n",
        "from api.cli import serve\n",
        "import typing\nif typing.TYPE_CHECKING:\n    from api.db import Database\n",
        "def later():\n    import api.embedded\n",
        "def later():\n    from ..core.wire import common\n    from api import service\n",
    ],
)
def test_an_import_of_the_service_under_tuner_is_found(tree_copy: Path, source: str) -> None:
    assert service_imports(tree_copy) == []
    (tree_copy / "tuner/worker/leak.py").write_text(source)
    found = service_imports(tree_copy)
    assert len(found) == 1, found
    assert found[0].startswith("tuner/worker/leak.py:")


@pytest.mark.parametrize(
    "source",
    [
        "import bench.search\n",
        "from bench import seqlen\n",
        "def later():\n    from bench.service import fill_store\n",
    ],
)
def test_a_test_importing_the_benchmarks_is_found(tmp_path: Path, source: str) -> None:
    (tmp_path / "tests" / "engine").mkdir(parents=True)
    (tmp_path / "tests" / "engine" / "test_fine.py").write_text("from tests.curves import Curve\n")
    assert bench_imports(tmp_path) == []
    (tmp_path / "tests" / "engine" / "test_leak.py").write_text(source)
    found = bench_imports(tmp_path)
    assert len(found) == 1, found
    assert found[0].startswith("tests/engine/test_leak.py:")
