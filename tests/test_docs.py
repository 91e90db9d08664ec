"""The documentation: the mkdocs site builds with --strict (a broken link, a missing anchor, a snippet that is gone or
an API reference to a name that no longer exists fails), the README stays a front page whose links land, and its
Python example runs as written on the demo's tiny decoder."""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
EXAMPLE_MARK = "<!-- tests/test_docs.py runs this block"
PAGES = sorted((ROOT / "docs").rglob("*.md")) + [README, ROOT / "ARCHITECTURE.md"]
LAYERS = "(?:builder|runner|cache|hardware|backends|families|export|diffusion|weights)"  # enginefarm.<layer>
FOLDERS = LAYERS[:-1] + "|enginefarm|tests|bench|recipes|ci|examples|docs)"  # top-level folders
FILE_TYPES = (
    "py",
    "toml",
    "yml",
    "c",
    "txt",
    "json",
    "onnx",
    "md",
    "safetensors",
    "npy",
    "npz",
    "png",
    "bin",
    "xml",
    "tar",
)  # `weights.onnx` is a file, not the module enginefarm.weights.onnx
SOURCE = re.compile(r"(?<![\w./<>-])(" + FOLDERS + r"/[\w./-]*?\.(?:py|toml|yml|c|txt))(?::(\w+))?")


def test_the_site_builds_strict_with_the_api_reference_and_the_architecture(tmp_path):
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(site)]
    proc = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The API reference came from the docstrings of the mapped layers (runner/ is enginefarm.runner: docs/_hooks).
    session = (site / "api" / "session" / "index.html").read_text()
    assert 'id="enginefarm.runner.session.Session.close"' in session and "Release the backend" in session
    assert 'id="enginefarm.runner.session.Session.run"' in session and "Run the artifact once" in session
    # A docstring's `<2>` outside backticks is read as an HTML tag and vanishes; the store layout keeps it.
    assert "blobs/sha256/&lt;2&gt;/&lt;digest&gt;" in (site / "api" / "stores" / "index.html").read_text()
    assert 'id="enginefarm.load"' in (site / "api" / "enginefarm" / "index.html").read_text()
    # ARCHITECTURE.md is embedded, not copied: its first heading is on the page.
    first_heading = next(line for line in (ROOT / "ARCHITECTURE.md").read_text().splitlines() if line.startswith("# "))
    assert first_heading[2:].split("(")[0].strip() in (site / "architecture" / "index.html").read_text()


def _outside_code(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _anchors(page: Path) -> set[str]:
    from markdown.extensions.toc import slugify

    text = _outside_code(page.read_text())
    return {slugify(m.group(1), "-") for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_the_readme_is_a_front_page_whose_links_land():
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    for command in ("make demo", "make test"):
        assert command in text
    links = re.findall(r"\]\(([^)\s]+)\)", _outside_code(text))
    local = [link for link in links if not link.startswith(("http://", "https://"))]
    assert len(local) >= 15  # the documentation table and the section links
    for link in local:
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.is_file(), f"README links to {link}, which is not there"
        if anchor:
            assert anchor in _anchors(target), f"README links to {link}: {path} has no heading #{anchor}"


def _example() -> str:
    text = README.read_text()
    after = text[text.index(EXAMPLE_MARK) :]
    return re.search(r"```python\n(.*?)```", after, flags=re.S).group(1)


def test_the_readmes_example_runs_on_the_demos_tiny_decoder(tmp_path, cli, capsys):
    """As the README says: make the tiny decoder, build recipes/tiny_sd.toml (here one job of it), run the block."""
    text = README.read_text()
    assert "python recipes/make_tiny_sd.py" in text and "enginefarm build recipes/tiny_sd.toml" in text
    recipe = tmp_path / "tiny_sd.toml"
    shutil.copy(ROOT / "recipes" / "tiny_sd.toml", recipe)  # its source is models/tiny_sd.onnx, beside it
    make = [sys.executable, str(ROOT / "recipes" / "make_tiny_sd.py"), "--out", str(tmp_path / "models/tiny_sd.onnx")]
    subprocess.run(make, check=True, capture_output=True)
    one_job = ("--target", "onnxruntime:cpu", "--precision", "fp32", "--no-bench")
    built = cli("build", str(recipe), *one_job, check=True)
    assert "1 built, 0 failed" in built.stdout

    exec(compile(_example(), "README.md", "exec"), {"__name__": "readme_example"})
    printed = capsys.readouterr().out
    assert printed.startswith("onnxruntime:cpu fp32 (1, 3, 32, 32)\n"), printed
    assert "chose onnxruntime:cpu fp32" in printed  # explain(): the one artifact built, and why


def _defines(path: Path, name: str) -> bool:
    return re.search(rf"^\s*(?:def|class) {name}\b|^{name}\b\s*[:=]", path.read_text(), flags=re.M) is not None


def _resolves(dotted: str) -> bool:
    """`enginefarm.a.b.C`: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attribute in parts[i:]:
                obj = getattr(obj, attribute)
        except AttributeError:
            return False
        return True
    return False


def test_the_docs_name_only_files_modules_and_names_that_exist():
    """Prose mkdocs cannot check: a renamed module or a moved file leaves `cache/old.py` or `enginefarm.x.Y` behind."""
    stale = []
    for page in PAGES:
        text = page.read_text()
        for m in SOURCE.finditer(text):  # `runner/binding.py:HostBinding`, `python bench/ttfi.py`: prose and commands
            path, name = ROOT / m.group(1), m.group(2)
            if m.group(1).startswith("recipes/models/") or text[max(0, m.start() - 8) : m.start()].endswith("error: "):
                continue  # generated models; paths inside quoted error messages
            if not path.is_file() or (name and not _defines(path, name)):
                stale.append(f"{page.name}: {m.group(0)}")
        for span in re.findall(r"`([^`]+)`", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)):
            for m in re.finditer(r"(?<![\w./-])(enginefarm(?:\.\w+)+|" + LAYERS + r"(?:\.\w+)+)(?![\w/])", span):
                dotted = m.group(1)
                if dotted.rsplit(".", 1)[1] in FILE_TYPES:
                    continue  # a file name (`weights.onnx`), not a module
                if not _resolves(dotted if dotted.startswith("enginefarm.") else f"enginefarm.{dotted}"):
                    stale.append(f"{page.name}: {dotted}")
            for m in re.finditer(r"(?<![\w./-])(" + FOLDERS + r"/[\w/]+)\.([A-Za-z_]\w*)\b", span):  # `a/b.Name`
                source = ROOT / (m.group(1) + ".py")
                if m.group(2) not in FILE_TYPES:
                    if not source.is_file() or not _defines(source, m.group(2)):
                        stale.append(f"{page.name}: {m.group(0)}")
    assert not stale, "the docs name what is not there (renamed or moved?):\n" + "\n".join(stale)


def test_the_code_layout_page_lists_every_module_of_the_product():
    """docs/layout.md is where a newcomer finds a module's purpose: a module that is not there fails here (the stale
    names test above catches the other way, a listed module that is gone). Product folders: pyproject's package-dir."""
    import tomllib

    package_dir = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    modules = {p.relative_to(ROOT).as_posix() for folder in package_dir.values() for p in (ROOT / folder).rglob("*.py")}
    assert len(modules) > 150 and "hardware/timing.py" in modules  # the mapping was read, hardware/ included
    layout = (ROOT / "docs" / "layout.md").read_text()
    listed = set(re.findall(r"`([\w/]+\.py)`", layout))
    missing = sorted(modules - listed)
    assert not missing, "docs/layout.md does not list (one line: what it is for):\n" + "\n".join(missing)


def test_the_readmes_pipeline_example_fits_the_api():
    """The README's prompt-to-image block needs a real model to run; its calls are bound to the signatures instead."""
    import ast
    import inspect

    from enginefarm.diffusion import Pipeline, write_png

    text = README.read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S) if "Pipeline.load" in b)
    targets = {
        "Pipeline.load": inspect.signature(Pipeline.load),
        "write_png": inspect.signature(write_png),
        "pipe": inspect.signature(Pipeline.__call__),
    }
    bound = set()
    for call in (node for node in ast.walk(ast.parse(block)) if isinstance(node, ast.Call)):
        name = ast.unparse(call.func)
        if name in targets:
            args = ([None] if name == "pipe" else []) + [None] * len(call.args)  # `pipe(...)` binds self too
            targets[name].bind(*args, **{k.arg: None for k in call.keywords})  # TypeError: an argument it does not take
            bound.add(name)
    assert bound == set(targets)
