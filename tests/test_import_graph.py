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
    # counting TYPE_CHECKING imports too: a type read in a circle is a module in the wrong place (runner/lookup.py)
    circles = graph.circles(found, "typing")
    named = "; ".join(" <-> ".join(c) for c in circles)
    assert circles == [], f"import circles (bench/import_graph.py --level typing --edges names each import): {named}"


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


def test_hardware_is_a_leaf_and_backends_and_builder_import_nothing_of_the_runner():
    """hardware/ (devices, probes, timing, device tensors) sits below backends and builder, which sit below the runner;
    formats/ (the file formats every layer reads) imports only the cache and the errors, and nothing below the runner
    imports the builder;
    sessions/ (what a load opens) imports only hardware/ and the errors: every import counted, TYPE_CHECKING ones
    too, as bench/import_graph.py reports them."""
    graph = _graph()
    found = graph.edges()
    used = {(e.source, e.target) for e in found}
    # The rules are read over the edges that matter: backends and builder do use the machine, and the runner too.
    assert {
        ("enginefarm.backends.openvino", "enginefarm.hardware.device_info"),
        ("enginefarm.builder.bench", "enginefarm.hardware.timing"),
        ("enginefarm.runner.detect", "enginefarm.hardware.devices"),
        ("enginefarm.backends.onnxruntime", "enginefarm.sessions.onnxruntime"),
        ("enginefarm.sessions.openvino", "enginefarm.hardware.tensors"),
        ("enginefarm.runner.custom", "enginefarm.formats.weightmap"),
        ("enginefarm.backends.onnxruntime", "enginefarm.formats.onnx_data"),
        ("enginefarm.builder.prep", "enginefarm.formats.fp16_rules"),
    } <= used
    wrong = [f"{e.source} -> {e.target} (line {e.line}, {e.level})" for e in graph.upward(found)]
    assert wrong == [], f"imports against the layers: {wrong}"


def test_hardware_needs_only_the_standard_library_numpy_psutil_and_the_probed_sdks():
    """What hardware/ imports from outside enginefarm: a leaf that pulls in a heavy library is no leaf."""
    import ast

    allowed = set(sys.stdlib_module_names) | {"numpy", "psutil", "pynvml", "openvino", "enginefarm"}
    outside = set()
    for path in (ROOT / "hardware").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                outside |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level:
                outside.add(node.module.split(".")[0])
    assert {"numpy", "psutil", "os"} <= outside and outside <= allowed, outside - allowed


def test_the_layer_rules_catch_an_upward_import():
    graph = _graph()
    Edge = graph.Edge
    found = [
        Edge("enginefarm.hardware.devices", "enginefarm.backends", 1, "function"),
        Edge("enginefarm.hardware.devices", "enginefarm.errors", 2, "module"),
        Edge("enginefarm.backends.base", "enginefarm.runner.detect", 3, "typing"),
        Edge("enginefarm.builder.bench", "enginefarm.hardware.timing", 4, "module"),
        Edge("enginefarm.runner.load", "enginefarm.builder.build", 5, "function"),
        Edge("enginefarm.backends.onnxruntime", "enginefarm.builder.onnx_data", 6, "function"),
        Edge("enginefarm.formats.weightmap", "enginefarm.backends.base", 7, "module"),
        Edge("enginefarm.weights.lora", "enginefarm.formats.safetensors_io", 8, "module"),
        Edge("enginefarm.diffusion.embeddings", "enginefarm.builder.safetensors_io", 9, "function"),
    ]
    assert [e.line for e in graph.upward(found)] == [1, 3, 6, 7, 9]
