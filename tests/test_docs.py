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

import numpy as np
import pytest

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


@pytest.mark.slow  # over a second of the quick loop's time (make test-fast)
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
    pipeline = (site / "api" / "diffusion" / "index.html").read_text()  # the call is the pipeline's API
    assert 'id="enginefarm.diffusion.Pipeline.__call__"' in pipeline and "num_images_per_prompt" in pipeline
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


GETTING_STARTED = ROOT / "docs" / "getting-started.md"
INSTALLS = ("make", "source", "pip")  # commands that set up an environment: checked, not run (see below)


def _code_blocks(page: Path) -> list[tuple[str, str]]:
    """(language, body) of each fenced block of `page`, in order."""
    return re.findall(r"^```(\w+)\n(.*?)^```", page.read_text(), flags=re.S | re.M)


def _check_install(line: str) -> None:
    """An install line cannot run inside the suite (it would rebuild .venv), so each is held to what it names: `make
    X` to a target make can plan (`make -n`), `pip install '.[a,b]'` to extras pyproject declares, `source
    .venv/bin/activate` to the venv this test runs in."""
    import shlex
    import tomllib

    words = shlex.split(line, comments=True)
    if words[0] == "make":
        proc = subprocess.run(["make", "-n", *words[1:]], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, f"{line}: {proc.stderr}"
    elif words[0] == "source":
        assert words[1] == ".venv/bin/activate" and (Path(sys.executable).parent / "activate").is_file()
    else:
        assert words[:2] == ["pip", "install"], line
        declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
        extras = [w for w in words[2:] if w.startswith(".[")]
        assert extras, line
        for extra in (e for w in extras for e in w[2:-1].split(",")):
            assert extra in declared, f"{line}: pyproject has no extra {extra!r}"
        if '"$(python -m enginefarm.toolchain)"' in line:
            assert words[words.index("-c") + 1] == "$(python -m enginefarm.toolchain)", line


@pytest.mark.slow
def test_every_command_of_getting_started_runs_as_written(tmp_path, monkeypatch, capsys):
    """The page's walkthrough, run in order from a folder laid out as a checkout (recipes/ linked): make the tiny
    model, export, build, generate, from Python too, a LoRA, a single-file checkpoint; each command must succeed and
    each image must be what the page says it is."""
    from enginefarm.diffusion import read_png

    (tmp_path / "recipes").symlink_to(ROOT / "recipes")
    monkeypatch.chdir(tmp_path)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    ran, checked = [], 0
    for language, body in _code_blocks(GETTING_STARTED):
        if language == "python":
            exec(compile(body, "getting-started.md", "exec"), {"__name__": "getting_started"})
            ran.append("python block")
            continue
        assert language == "sh", f"a {language} block in getting-started.md: say how the docs test runs it"
        for line in (raw.strip() for raw in body.splitlines()):
            if not line or line.startswith("#"):
                continue
            if line.split()[0] in INSTALLS:
                _check_install(line)
                checked += 1
                continue
            proc = subprocess.run(["bash", "-c", line], capture_output=True, text=True, env=env, timeout=600)
            assert proc.returncode == 0, f"{line}\n{proc.stdout}\n{proc.stderr}"
            ran.append(line.split("#")[0].strip())
    assert checked >= 8 and len(ran) >= 10, (checked, ran)
    assert any(c.startswith("enginefarm build") for c in ran) and "python block" in ran

    plain = read_png("lighthouse.png")
    assert plain.shape == (64, 64, 3) and plain.std() > 0.01  # the tiny model's native size; an image, not a flat fill
    assert capsys.readouterr().out.splitlines()[-1] == "(64, 64, 3)"
    assert np.array_equal(read_png("lighthouse-python.png"), plain)  # the page's Python is the command, same seed
    for changed in ("lighthouse-lora.png", "lighthouse-finetune.png"):
        assert np.abs(read_png(changed) - plain).max() > 4 / 255, changed  # the LoRA, the fine-tune were applied


@pytest.mark.slow  # imports diffusers (and torch)
def test_every_argument_the_diffusers_page_names_exists_on_both_sides():
    """docs/coming-from-diffusers.md's tables: each `name=` in the diffusers column is a parameter of one of diffusers'
    pipelines (or the loading calls the row names), each in the enginefarm column one of `Pipeline.load`,
    `Pipeline.__call__` or `set_loras`; each `--option` of the generate column is one `enginefarm generate` takes."""
    import inspect

    diffusers = pytest.importorskip("diffusers")
    from enginefarm.cli_generate import generate_cmd
    from enginefarm.diffusion import Pipeline

    theirs: set[str] = set()
    methods = ("__init__", "__call__", "from_pretrained", "load_lora_weights", "set_adapters", "load_textual_inversion")
    classes = ("StableDiffusion", "StableDiffusionImg2Img", "StableDiffusionInpaint", "StableDiffusionControlNet")
    classes += ("StableDiffusionXL", "StableDiffusionXLImg2Img", "StableDiffusion3", "Flux", "Chroma", "Diffusion")
    for cls in [getattr(diffusers, f"{name}Pipeline") for name in classes] + [diffusers.AutoencoderKL]:
        for method in (getattr(cls, m, None) for m in methods):
            if callable(method):
                theirs |= set(inspect.signature(method).parameters)
                # from_pretrained takes most of its arguments as **kwargs, documented as `name (type, ...)`
                theirs |= set(re.findall(r"^\s+(\w+) \(", method.__doc__ or "", flags=re.M))
    ours = {
        *inspect.signature(Pipeline.load).parameters,
        *inspect.signature(Pipeline.__call__).parameters,
        *inspect.signature(Pipeline.set_loras).parameters,
    }
    options = {o for p in generate_cmd.params for o in getattr(p, "opts", ())}
    rows = [
        line.split("|")[1:-1]
        for line in (ROOT / "docs" / "coming-from-diffusers.md").read_text().splitlines()
        if line.startswith("| `") or line.startswith("| (")
    ]
    assert len(rows) >= 25
    named = lambda cell: set(re.findall(r"(?<![\w.])([a-z_]+)=", cell))  # noqa: E731
    missing = []
    for row in rows:
        missing += [f"diffusers {n}" for n in named(row[0]) - theirs]
        missing += [f"enginefarm {n}" for n in named(row[1]) - ours]
        if len(row) == 4:  # the calling table: diffusers, pipe(...), enginefarm generate, what differs
            missing += [f"generate {o}" for o in re.findall(r"(--[a-z-]+)", row[2]) if o not in options]
    assert not missing, missing


def test_docstrings_say_what_and_why_not_what_a_past_run_measured():
    """A measurement ("took 8.0 s", "peaked at 6.1 GB") is history the day the code changes; docstrings of the product
    say what and why, and the numbers live in docs/benchmarks.md ("Measurements behind the code")."""
    import ast
    import tomllib

    unit = r"\d+(?:\.\d+)?\s?(?:ms|s|min|minutes|MB|GB|MiB|GiB|KB)\b"
    past = re.compile(rf"\b(?:took|was|were|peaked|held)\b[^.;]*?{unit}")
    package_dir = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    found, read = [], 0
    for folder in package_dir.values():
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    text = " ".join((ast.get_docstring(node, clean=False) or "").split())
                    read += bool(text)
                    if m := past.search(text):
                        found.append(f"{path.relative_to(ROOT)}:{getattr(node, 'name', '')}: {m.group(0)}")
    assert read > 1000  # the product's docstrings were read
    assert not found, "move these measurements to docs/benchmarks.md:\n" + "\n".join(found)


def test_the_entry_points_document_every_parameter_in_args_sections():
    """mkdocs reads Google style: each public entry point has an `Args:` section naming every parameter it takes, so
    the API reference lists them (a parameter added without a line fails here)."""
    import inspect

    import enginefarm
    import enginefarm.filters
    from enginefarm.diffusion import Pipeline

    entry_points = {
        "enginefarm.load": enginefarm.load,
        "enginefarm.models": enginefarm.models,
        "Pipeline.load": Pipeline.load,
        "Pipeline.__call__": Pipeline.__call__,
        "enginefarm.filters.load": enginefarm.filters.load,
        "enginefarm.filters.apply": enginefarm.filters.apply,
    }
    for name, function in entry_points.items():
        doc = inspect.getdoc(function) or ""
        assert "\nArgs:\n" in doc, f"{name} has no Args: section"
        args = doc.split("\nArgs:\n", 1)[1].split("\n\n", 1)[0]
        documented = set(re.findall(r"^    (\w+)(?: \([^)]*\))?:", args, flags=re.M))
        wanted = {p for p in inspect.signature(function).parameters if p not in ("self", "cls")}
        assert documented == wanted, (
            f"{name}: Args lacks {sorted(wanted - documented)}, or names {sorted(documented - wanted)}"
        )
        assert "\nReturns:\n" in doc, f"{name} has no Returns: section"
