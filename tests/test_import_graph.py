"""No import circles in the product package `enginefarm` (every folder pyproject maps into it).

What counts: every import that runs, written at module level or inside a function (a lazy import still ties the two
modules together), relative imports resolved against their package, `from pkg import name` counted as an import of
the module `pkg.name` where that is one. What does not: imports under `if TYPE_CHECKING:` (never executed; the script
reports them with `--level typing`), and the implicit import of a module's parent package. The graph is read with
`ast` by bench/import_graph.py (`.venv/bin/python bench/import_graph.py --edges` prints any circle's edges)."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _graph():
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "bench" / "import_graph.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up while the class is made
    spec.loader.exec_module(module)
    return module


def test_the_product_package_has_no_import_circles():
    graph = _graph()
    found = graph.edges()
    assert len(graph.modules()) > 100 and len(found) > 400  # the whole package was read, not an empty corner
    assert {"enginefarm.builder.job", "enginefarm.builder.gate"} <= set(graph.modules())
    circles = graph.circles(found, "function")
    named = "; ".join(" <-> ".join(c) for c in circles)
    assert circles == [], f"import circles (bench/import_graph.py --edges names each import): {named}"


def test_the_graph_sees_relative_function_level_and_type_checking_imports(tmp_path):
    """The checker on a package made to hold each kind of circle: the test above cannot pass by seeing none."""
    (tmp_path / "pyproject.toml").write_text('[tool.setuptools.package-dir]\n"pkg" = "src"\n"pkg.sub" = "sub"\n')
    files = {
        "src/__init__.py": "",
        "src/a.py": "from .b import thing\n",  # a -> b -> a: relative, module level
        "src/b.py": "import pkg.a\nthing = 1\n",
        "src/c.py": "def late():\n    from pkg.sub import d\n",  # c -> sub.d -> c: inside a function
        # e -> sub.f -> e: under TYPE_CHECKING only
        "src/e.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.sub.f import F\n",
        "sub/__init__.py": "",
        "sub/d.py": "from ..c import late\n",
        "sub/f.py": "from pkg import e\nclass F: ...\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    graph = _graph()
    found = graph.edges(tmp_path)
    assert graph.circles(found, "module") == [["pkg.a", "pkg.b"]]
    assert graph.circles(found, "function") == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.sub.d"]]
    assert graph.circles(found, "typing") == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.sub.d"], ["pkg.e", "pkg.sub.f"]]
