"""The package's layout: the library apart from the book, one module per chapter, files a
reader can take in, and no value computed for the pages that no page quotes."""

import ast
import json
import re
from pathlib import Path

import pytest

from smallem import book

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "smallem"
# the command line joins the library and the book: cli.py, and the commands it dispatches to
JOINT = {"smallem.cli", "smallem.__main__"} | {
    ".".join(("smallem", *p.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__")
    for p in (PACKAGE / "commands").rglob("*.py")}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every smallem module ``path`` imports, at the top or inside a function, with
    ``from . import x`` resolved to ``package.x``."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")
                up = up[:len(up) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}
    known = {module_name(p) for p in PACKAGE.rglob("*.py")}
    return {m for m in out if m in known}


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
LIBRARY = [m for m in MODULES if not m.startswith("smallem.book") and m not in JOINT]


def test_the_walk_sees_imports():
    """The walk itself: it finds relative imports, imports inside functions, and packages."""
    assert "smallem.book.records" in imports(MODULES["smallem.book.ch1.measuring"])
    assert "smallem.product.gemm" in imports(MODULES["smallem.book.ch2.measuring"])
    assert "smallem.book" in imports(MODULES["smallem.cli"])  # inside main()
    assert "smallem.product.gemm" in LIBRARY and "smallem.book.ch2" not in LIBRARY


@pytest.mark.parametrize("module", LIBRARY)
def test_library_imports_nothing_from_the_book(module):
    bad = sorted(m for m in imports(MODULES[module]) if m.startswith("smallem.book"))
    assert not bad, f"{module} (library) imports {', '.join(bad)} (the book's)"


@pytest.mark.parametrize("module", LIBRARY)
def test_no_library_module_holds_command_line_code(module):
    """Each command's options and body are in smallem/commands/ (or a chapter's book module):
    a library module parses no arguments."""
    text = MODULES[module].read_text()
    assert "argparse" not in text and "add_argument(" not in text, (
        f"{module} holds command-line code: it belongs in smallem/commands/")


def _cycles(edges: dict) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in edges:
        if v not in index:
            visit(v)
    return out


def test_no_import_circle_in_the_package():
    """No two modules import each other, directly or around a loop (an import inside a
    function counts: it is the same dependency, only later). A package's __init__ is left
    out where it only hands names on from its own modules."""
    edges = {m: {x for x in imports(p) if x in MODULES and x != m and not m.startswith(x + ".")}
             for m, p in MODULES.items()}
    found = _cycles(edges)
    assert not found, f"import circles: {found}"
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]  # the check itself


def chapter_of(module: str) -> str | None:
    """The chapter a module of the book belongs to (a chapter may be a package)."""
    for c in book.CHAPTERS:
        if module == f"smallem.book.{c}" or module.startswith(f"smallem.book.{c}."):
            return c
    return None


def test_no_cycle_between_chapters():
    chapters = set(book.CHAPTERS)
    edges = {c: set() for c in chapters}
    for m, path in MODULES.items():
        if chapter_of(m):
            edges[chapter_of(m)] |= {chapter_of(x) for x in imports(path) if chapter_of(x)}
    for c in chapters:
        edges[c].discard(c)

    def reach(start):
        seen, todo = set(), [start]
        while todo:
            for nxt in edges[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    cyclic = sorted(c for c in chapters if c in reach(c))
    assert not cyclic, f"chapter modules in an import cycle: {cyclic}"


def test_one_list_of_chapters():
    """Every chapter module is in the list, and has what the list's users need."""
    on_disk = ({p.stem for p in (PACKAGE / "book").glob("*.py")}
               | {p.parent.name for p in (PACKAGE / "book").glob("*/__init__.py")})
    for name, module in zip(book.CHAPTERS, book.modules()):
        assert name in on_disk
        assert callable(module.report) and module.RECORDS
        assert module.MEASURE is None or module.MEASURE in module.COMMANDS
        for func, add_arguments, help_ in module.COMMANDS.values():
            assert callable(func) and help_
    # `make book` measures through the one list: the chapters' MEASURE commands, in book
    # order, and the Makefile names none of them itself
    wanted = [m.MEASURE for m in book.modules() if m.MEASURE]
    assert book.measure_commands() == wanted and len(wanted) >= 4
    recipe = (ROOT / "Makefile").read_text().split("\nbook:", 1)[1].split("\n\n", 1)[0]
    assert "smallem measure" in recipe
    assert not any(f"smallem {c}" in recipe for c in wanted), recipe


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: p.name)
def test_files_a_reader_can_take_in(path):
    limit = 700 if path == PACKAGE / "gemm.py" else 800
    lines = len(path.read_text().splitlines())
    assert lines <= limit, f"{path.relative_to(ROOT)}: {lines} lines (at most {limit})"


KERNEL_FILES = sorted(p for d in ("kernels_c", "kernels_cuda") for p in (ROOT / d).rglob("*")
                      if p.suffix in (".c", ".h", ".cu", ".cuh"))


@pytest.mark.parametrize("path", KERNEL_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_kernel_files_a_reader_can_take_in(path):
    """The C and CUDA files under the same cap as the Python: a file a reader can open and
    hold (the one forward is a loop in forward.c and its parts in kernels_c/forward/)."""
    lines = len(path.read_text().splitlines())
    assert lines <= 800, f"{path.relative_to(ROOT)}: {lines} lines (at most 800)"


BOOK_FUNCTION_LINES = 80  # a book function a reader can hold at once, docstring included


@pytest.mark.parametrize("path", sorted((PACKAGE / "book").rglob("*.py")),
                         ids=lambda p: str(p.relative_to(PACKAGE / "book")))
def test_no_book_function_is_longer_than_a_reader_can_hold(path):
    tree = ast.parse(path.read_text())
    long = [f"{n.name} ({n.end_lineno - n.lineno + 1} lines)" for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.end_lineno - n.lineno + 1 > BOOK_FUNCTION_LINES]
    assert not long, f"{path.relative_to(ROOT)}: {', '.join(long)}"


def quoted_text() -> str:
    pages = sorted((ROOT / "chapters").glob("*.md")) + sorted((ROOT / "notebooks").glob("*.py"))
    return "\n".join(p.read_text() for p in pages)


def test_every_value_is_quoted(tmp_path, monkeypatch):
    """A value the records give a page that no page or notebook quotes is dead code: the
    values of the committed records, each named in a chapter (``{{ key }}``) or a notebook.
    The ``book.*`` values say which chapters have a record here: the site's hook reads them
    (chapters/hooks/values.py), no page."""
    monkeypatch.setenv("SMALLEM_FIGURES", str(tmp_path))
    values = book.report_all()
    text = quoted_text()
    unquoted = sorted(k for k in values if not k.startswith("book.")
                      and not re.search(re.escape(k) + r"(?![\w.])", text))
    assert not unquoted, f"values no page or notebook quotes: {unquoted}"
    written = json.loads((tmp_path / "tables" / "values.json").read_text())
    assert written == values
