"""The `enginefarm` command. Thin: parse options, call the library, draw results. User errors print one line."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import click

from enginefarm.cli_options import precision_option, stacked, target_option
from enginefarm.errors import ConfigError, EnginefarmError, missing_extra
from enginefarm.settings import load_settings


def _console(stderr: bool = False):
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    # Piped output (CI logs, files) gets wide lines instead of rich's 80-column default.
    return Console(stderr=stderr, highlight=False, width=None if stream.isatty() else 200)


def _setup_logging(verbose: int) -> None:
    from rich.logging import RichHandler

    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    handler = RichHandler(console=_console(stderr=True), show_path=False, show_time=False)
    logging.basicConfig(level=level, handlers=[handler], format="%(message)s")


class _Group(click.Group):
    """Turns every EnginefarmError into `error: … / hint: …` and exit 1; other exceptions are bugs and keep their traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except EnginefarmError as exc:
            _fail(exc)
        except ModuleNotFoundError as exc:  # an optional dependency: name the extra that brings it
            known = missing_extra(exc)
            if known is None:
                raise
            _fail(known)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)
        except OSError as exc:  # a full disk wherever it struck: the user's problem to fix, not a bug to trace
            from enginefarm.cache.space import disk_full, is_full

            if not is_full(exc):
                raise
            full = disk_full(Path(exc.filename).parent if exc.filename and Path(str(exc.filename)).is_absolute() else Path.cwd(), None)
            click.echo(f"error: {full}", err=True)
            click.echo(f"hint: {full.hint}", err=True)
            sys.exit(1)


def _fail(exc: EnginefarmError) -> None:
    click.echo(f"error: {exc}", err=True)
    if exc.hint:
        click.echo(f"hint: {exc.hint}", err=True)
    sys.exit(1)


store_option = click.option("--store", metavar="URL", help="Store: a directory, file://, s3:// or https:// (default ENGINEFARM_STORE).")


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
@click.version_option(package_name="enginefarm")
def main(verbose: int) -> None:
    """Ahead-of-time engines for SD-class models: plan, build and publish them; fetch, verify and run them."""
    _setup_logging(verbose)
    import signal

    # SIGTERM (CI cancelling a job, `kill`) unwinds like Ctrl-C, so worker processes and temp files are cleaned up.
    # SIGINT gets Python's handler even where the launching shell ignored it (background jobs in scripts).
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _plan(recipes, store, targets, precisions, components, jobs=(), runners=None, runner_labels=(), *, store_must_exist=True):
    from enginefarm.builder.planner import plan
    from enginefarm.builder.recipe import load_recipe
    from enginefarm.builder.runners import load_runners
    from enginefarm.cache.stores import open_store

    settings = load_settings()
    loaded = [load_recipe(p) for p in recipes]
    # `build` creates its store; every other command reads one, so a path the user named must be there.
    opened = open_store(store or settings.store, must_exist=store_must_exist and (bool(store) or settings.store_explicit))
    planned = plan(loaded, settings.home / "sources", store=opened, targets=targets, precisions=precisions,
                   components=components, job_ids=jobs, offline=settings.offline,
                   runners=load_runners(runners) if runners else None, runner_labels_filter=runner_labels)
    return planned, opened, settings


_select = stacked(target_option, precision_option,
                  click.option("--component", "components", multiple=True, metavar="NAME", help="Only this component. Repeatable."))


@main.command("plan")
@click.argument("recipes", nargs=-1, required=True, type=click.Path(path_type=Path))
@store_option
@_select
@click.option("--format", "fmt", type=click.Choice(["table", "json", "github"]), default="table", show_default=True)
@click.option("--runners", type=click.Path(path_type=Path), help="The farm's runners (TOML): route jobs by target and memory.")
@click.option("--runner-labels", default="", metavar="A,B,…", help="Only jobs a runner with these labels can build.")
def plan_cmd(recipes, store, targets, precisions, components, fmt, runners, runner_labels):
    """Show the jobs RECIPES expand to, with their build keys and status here.

    --format github prints {"matrix": …} for a GitHub Actions build matrix (at most 256 entries, jobs batched
    per runner), the job count, and the jobs no runner can build."""
    from enginefarm.builder.ci_matrix import github_matrix
    from enginefarm.cache.keys import short

    labels = tuple(filter(None, (label.strip() for label in runner_labels.split(","))))
    planned, _, _ = _plan(recipes, store, targets, precisions, components, runners=runners, runner_labels=labels)
    if fmt == "json":
        click.echo(json.dumps([p.to_dict() for p in planned], indent=1))
        return
    if fmt == "github":
        click.echo(json.dumps(github_matrix(planned)))
        return
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"{len(planned)} jobs")
    for column in ("job", "key", "model/component", "precision", "profile", "target", "memory", "runs on", "status"):
        table.add_column(column)
    for p in planned:
        style = "green" if p.built else "red" if p.unroutable or p.refused else "yellow" if p.availability.can_build else "dim"
        table.add_row(p.job.id, short(p.key), f"{p.job.model}/{p.job.component}", p.job.precision, p.job.profile_name, str(p.job.target),
                      f"{p.to_dict()['memory_gb']:g} GB", escape(",".join(p.runs_on)), f"[{style}]{escape(p.status)}[/]")
    _console().print(table)


@main.command("build")
@click.argument("recipes", nargs=-1, required=True, type=click.Path(path_type=Path))
@store_option
@_select
@click.option("--job", "jobs", multiple=True, metavar="ID", help="Only the planned job with this id (see `plan`). Repeatable.")
@click.option("-j", "--jobs-parallel", "parallel", type=click.IntRange(1, 64), default=1, show_default=True, help="Jobs built at once, each in its own process.")
@click.option("--no-bench", is_flag=True, help="Skip the benchmark (resolution then cannot rank by speed).")
@click.option("--report", type=click.Path(path_type=Path), help="Write the results as JSON here.")
@click.option("--memory", metavar="SIZE", help="Memory the jobs may use together, e.g. 16G (default: what is available when the build starts).")
def build_cmd(recipes, store, targets, precisions, components, jobs, parallel, no_bench, report, memory):
    """Build, validate, benchmark and publish every job of RECIPES that is not in the store yet.

    A stored artifact whose [validate] settings changed since it was judged is re-validated, not rebuilt. Jobs run
    in parallel (-j) only while their estimated memory needs fit --memory together; `plan` shows each job's need.
    The report (--report) gives each job's time and peak memory per stage."""
    from rich.markup import escape

    from enginefarm.settings import parse_size

    budget = parse_size("--memory", memory)
    planned, opened, settings = _plan(recipes, store, targets, precisions, components, jobs, store_must_exist=False)
    todo = [p.job for p in planned if p.availability.can_build and not p.refused and (not p.built or p.stale_validation)]
    console = _console()
    for p in planned:
        if p.built and not p.stale_validation:
            console.print(f"[green]exists[/]   {p.job.label}")
        elif p.refused or not p.availability.can_build:
            console.print(f"[dim]skipped[/]  {p.job.label}: {escape(p.status)}")
    results = _run_jobs(console, todo, opened, settings, f"building {len(todo)} job(s) into {opened.url}", parallel, bench=not no_bench,
                        memory=budget)
    revalidated = sum(r.status == "revalidated" for r in results)
    refused = sum(bool(p.refused) and not p.built for p in planned)
    unavailable = sum(not p.availability.can_build and not p.refused and not p.built for p in planned)
    console.print(f"{sum(r.status == 'built' for r in results)} built, {sum(r.status == 'failed' for r in results)} failed, "
                  f"{sum(p.built for p in planned)} already stored" + (f" ({revalidated} re-validated)" if revalidated else "")
                  + f", {unavailable} unavailable here" + (f", {refused} refused (see `enginefarm plan`)" if refused else ""))
    _finish(results, report)


@main.command("validate")
@click.argument("recipes", nargs=-1, required=True, type=click.Path(path_type=Path))
@store_option
@_select
@click.option("-j", "--jobs-parallel", "parallel", type=click.IntRange(1, 64), default=1, show_default=True, help="Artifacts checked at once.")
@click.option("--report", type=click.Path(path_type=Path), help="Write the results as JSON here.")
def validate_cmd(recipes, store, targets, precisions, components, parallel, report):
    """Re-check the stored artifacts of RECIPES against their current [validate] settings; rebuild nothing.

    Each verdict is recorded in the store: an artifact that fails is no longer picked by `load`."""
    planned, opened, settings = _plan(recipes, store, targets, precisions, components)
    console = _console()
    todo = [p.job for p in planned if p.built]
    for p in planned:
        if not p.built:
            console.print(f"[dim]skipped[/]  {p.job.label}: {'not in the store' if p.key else p.status}")
    results = _run_jobs(console, todo, opened, settings, f"re-validating {len(todo)} artifact(s) in {opened.url}", parallel,
                        bench=False, validate_only=True)
    console.print(f"{sum(r.status == 'revalidated' for r in results)} passed, {sum(r.status == 'failed' for r in results)} failed, "
                  f"{len(planned) - len(todo)} not stored")
    _finish(results, report)


def _run_jobs(console, todo, opened, settings, title: str, parallel: int, *, bench: bool, validate_only: bool = False,
              memory: int | None = None) -> list:
    """Run jobs in worker processes with a live line each; returns their results."""
    from rich.markup import escape
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from enginefarm.builder.executor import run_jobs

    if not todo:
        return []
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console, transient=False) as bar:
        overall = bar.add_task(title, total=len(todo))
        rows = {job.id: bar.add_task(f"[dim]queued[/]   {job.label}", total=None) for job in todo}
        labels = {job.id: job.label for job in todo}

        def on_event(job_id, kind, detail):
            task = rows.get(job_id)
            if task is None:
                return
            if kind == "step":
                bar.update(task, description=f"[cyan]{detail:<9}[/] {labels[job_id]}")
            elif kind == "transfer":
                _name, done, total = detail
                bar.update(task, description=f"[cyan]upload {done / 2**20:.1f}/{total / 2**20:.1f} MiB[/] {labels[job_id]}")
            elif kind == "done":
                color = {"built": "green", "exists": "green", "revalidated": "green", "missing": "yellow", "failed": "red"}[detail.status]
                reason = detail.reason.removeprefix(f"{labels[job_id]}: ").splitlines()[0] if detail.reason else ""
                peak = f", peak {detail.peak_rss_mb / 1024:.1f} GB" if detail.peak_rss_mb else ""
                extra = f" ({detail.seconds:.1f}s{peak})" if detail.status in ("built", "revalidated") else f": {escape(reason)}" if reason else ""
                bar.update(task, description=f"[{color}]{detail.status:<9}[/] {labels[job_id]}{extra}", total=1, completed=1)
                bar.advance(overall)

        return run_jobs(todo, opened.url, settings.home / "build", parallel=parallel, bench=bench, on_event=on_event,
                        memory=memory, validate_only=validate_only)


def _finish(results: list, report: Path | None) -> None:
    """Write the JSON report; print each failure in full (with the SDK's traceback under -v); exit 1 on any."""
    if report:
        report.write_text(json.dumps([r.to_dict() for r in results], indent=1))
    failed = [r for r in results if r.status == "failed"]
    if not failed:
        return
    verbose = logging.getLogger().isEnabledFor(logging.INFO)
    for r in failed:
        click.echo(f"failed: {r.reason}", err=True)
        if verbose and r.detail:
            click.echo(r.detail.rstrip(), err=True)
    if not verbose and any(r.detail for r in failed):
        click.echo("(-v shows the SDK's traceback)", err=True)
    sys.exit(1)


@main.command("ls")
@store_option
@click.option("--model", metavar="NAME", help="Only this model.")
@click.option("--json", "as_json", is_flag=True)
def ls_cmd(store, model, as_json):
    """List the artifacts in a store (through each model's index)."""
    from rich.table import Table

    from enginefarm.cache.index import read_index
    from enginefarm.cache.stores import open_store

    settings = load_settings()
    # A typo'd --store would otherwise list as an empty store; the default store simply has nothing built yet.
    opened = open_store(store or settings.store, must_exist=bool(store) or settings.store_explicit)
    rows = []
    for name in opened.list_models():
        if model and name != model:
            continue
        for entry in read_index(opened, name).entries.values():
            bench = (entry.benchmarks or ({},))[0]
            rows.append({"model": name, **{k: getattr(entry, k) for k in ("model_version", "component", "precision", "profile_name", "target", "build_key", "size", "stored_size", "created")},
                         "p50_ms": bench.get("p50_ms"), "validation": _verdict_text(entry.validation)})
    from enginefarm.cache.versions import version_key

    rows.sort(key=lambda r: (r["target"], r["precision"]))  # stable sorts: by component, newest version first, then target
    rows.sort(key=lambda r: version_key(r["model_version"]), reverse=True)
    rows.sort(key=lambda r: (r["model"], r["component"]))
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    table = Table(title=f"{len(rows)} artifacts in {opened.url}")
    for column in ("model/component", "version", "precision", "profile", "target", "key", "size MiB", "stored MiB", "p50 ms", "validation"):
        table.add_column(column)
    for r in rows:
        table.add_row(f"{r['model']}/{r['component']}", r["model_version"] or "?", r["precision"], r["profile_name"], r["target"], r["build_key"][:12],
                      f"{(r['size'] or 0) / 2**20:.2f}", f"{(r['stored_size'] or 0) / 2**20:.2f}", f"{r['p50_ms']:.2f}" if r["p50_ms"] is not None else "-",
                      r["validation"])
    _console().print(table)


def _verdict_text(verdict) -> str:
    """An index entry's verdict in a few words: passed with its worst cosine, not run here, or failed (not served)."""
    if not isinstance(verdict, dict) or "passed" not in verdict:
        return "-"
    again = " (re-checked)" if verdict.get("revalidated") else ""
    if verdict["passed"] is None:
        return "not run where built"
    if verdict["passed"]:
        cosine = verdict.get("min_cosine")
        return f"passed{again}" + (f", cos {cosine:.6f}" if isinstance(cosine, (int, float)) else "")
    return f"FAILED{again}: not served"


@main.command("index")
@click.option("--store", metavar="URL", required=True, help="The store whose index to rebuild.")
def index_cmd(store):
    """Rebuild every model's index from the store's manifests."""
    from enginefarm.cache.artifacts import rebuild_index
    from enginefarm.cache.stores import open_store

    counts = rebuild_index(open_store(store))
    for model, count in sorted(counts.items()):
        click.echo(f"{model}: {count} artifacts")
    if not counts:
        click.echo("no manifests found")


ref_options = [
    click.option("--precision", type=click.Choice(["fp32", "fp16", "bf16"]), help="Default: the fastest measured."),
    click.option("--device", default="auto", show_default=True, help="auto, cpu, nvidia, intel, amd or apple."),
    click.option("--target", metavar="T", help="Only artifacts for this target (backend:device or backend)."),
    store_option,
    click.option("--channel", metavar="NAME", help="Only artifacts released in this signed channel (default ENGINEFARM_CHANNEL)."),
    click.option("--trusted-root", type=click.Path(path_type=Path), help="The channel's root.json (default ENGINEFARM_TRUSTED_ROOT)."),
    click.option("--version", "model_version", metavar="V", help="Serve this model version (default: the newest with an artifact usable here)."),
]


def _ref_opts(func):
    for option in reversed(ref_options):
        func = option(func)
    return func


class _RichProgress:
    """Draws the library's progress callback: messages as dim lines, transfers as bars with bytes, rate and ETA,
    other work (an engine compiled on the device) as bars with steps and elapsed time."""

    def __init__(self) -> None:
        from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn,
                                   TimeRemainingColumn, TransferSpeedColumn)
        from rich.text import Text

        from enginefarm.cache.progress import Progress as Callback

        class Either(ProgressColumn):
            """One column for both kinds of bar: `bytes` for transfers, `steps` for work."""

            def __init__(self, bytes_column, steps_column) -> None:
                super().__init__()
                self.columns = {"bytes": bytes_column, "steps": steps_column}

            def render(self, task):
                column = self.columns[task.fields.get("unit", "bytes")]
                return column.render(task) if column is not None else Text("")

        self.console = _console(stderr=True)
        self.bars = Progress(TextColumn("{task.description}"), BarColumn(), Either(DownloadColumn(), MofNCompleteColumn()),
                             Either(TransferSpeedColumn(), None), Either(TimeRemainingColumn(), TimeElapsedColumn()),
                             console=self.console, transient=False)
        self.tasks: dict[str, int] = {}
        outer = self

        def update(name: str, done: int, total: int, unit: str) -> None:
            if name not in outer.tasks:
                outer.bars.start()
                outer.tasks[name] = outer.bars.add_task(name, total=total, unit=unit)
            outer.bars.update(outer.tasks[name], completed=done, total=total)

        class Callback_(Callback):
            def message(self, text: str) -> None:
                outer.console.print(f"[dim]{text}[/]", markup=True, highlight=False)

            def transfer(self, name: str, done: int, total: int) -> None:
                update(name, done, total, "bytes")

            def work(self, name: str, done: int, total: int) -> None:
                update(name, done, total, "steps")

        self.callback = Callback_()

    def __enter__(self):
        return self.callback

    def __exit__(self, *exc) -> None:
        if self.tasks:  # stopping bars that never started prints an empty line before the error or result
            self.bars.stop()


@main.command("run")
@click.argument("ref", metavar="MODEL/COMPONENT")
@click.option("--input", "inputs", multiple=True, metavar="NAME=FILE.npy", help="An input array. Repeatable. A .npz gives all inputs at once.")
@click.option("--output", type=click.Path(path_type=Path), help="Write all outputs to this .npz.")
@click.option("--recipe", type=click.Path(path_type=Path), help="Compile here from this recipe if nothing stored fits.")
@click.option("--explain", is_flag=True, help="Print why this artifact was chosen.")
@click.option("--weights", type=click.Path(path_type=Path), help="A custom checkpoint (.safetensors) in the base checkpoint's names.")
@click.option("--lora", "loras", multiple=True, metavar="PATH[:STRENGTH]", help="A LoRA (.safetensors) and its strength (default 1). Repeatable.")
@_ref_opts
def run_cmd(ref, inputs, output, recipe, explain, weights, loras, precision, device, target, store, channel, trusted_root, model_version):
    """Run MODEL/COMPONENT on the best artifact for this device."""
    import time

    import numpy as np

    from enginefarm.runner.load import load

    feeds = _read_inputs(inputs)
    start = time.perf_counter()
    with _RichProgress() as progress:
        session = load(ref, precision, device, store, weights, [_lora_option(item) for item in loras], recipe=recipe, target=target,
                       progress=progress, channel=channel, trusted_root=trusted_root, version=model_version)
    loaded = time.perf_counter()
    outputs = session.run(feeds)
    done = time.perf_counter()
    if explain:
        click.echo(session.explain())
    for name, value in outputs.items():
        click.echo(f"{name}: {value.dtype}{list(value.shape)} mean {float(np.mean(value)):.5g} std {float(np.std(value)):.5g}")
    click.echo(f"{session.artifact.target} {session.artifact.precision} [{session.artifact.build_key[:12]}]: load {1000 * (loaded - start):.0f} ms, run {1000 * (done - loaded):.0f} ms")
    if output:
        from enginefarm.cache.atomic import atomic_writer

        with atomic_writer(output) as handle:
            np.savez(handle, **outputs)
        click.echo(f"wrote {output}")


def _lora_option(item: str) -> tuple[str, float]:
    """PATH:STRENGTH, or PATH alone for strength 1 (a path may itself hold ':', so only a number after the last counts)."""
    path, sep, strength = item.rpartition(":")
    try:
        return (path, float(strength)) if sep and path else (item, 1.0)
    except ValueError:
        if sep and path and not Path(item).exists():  # a typo in the strength, not a path with ':' in it
            raise ConfigError(f"--lora {item}: strength {strength!r} is not a number",
                              hint="--lora PATH[:STRENGTH], e.g. --lora style.safetensors:0.8") from None
        return item, 1.0


def _read_inputs(items: tuple[str, ...]) -> dict:
    import numpy as np

    feeds = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep:
            path, name = name, ""
        file = Path(path)
        if not file.is_file():
            raise ConfigError(f"input file not found: {file}")
        if file.suffix != ".npz" and not name:
            raise ConfigError(f"--input {item}: give NAME=FILE.npy", hint="only .npz files carry their own names")
        try:
            if file.suffix == ".npz":
                with np.load(file) as data:
                    feeds.update({k: data[k] for k in data.files})
            else:
                feeds[name] = np.load(file, allow_pickle=False)
        except (ValueError, OSError):
            raise ConfigError(f"cannot read {file}: not a numpy .npy/.npz file", hint="save arrays with numpy.save or numpy.savez") from None
    if not feeds:
        raise ConfigError("no inputs given", hint="--input NAME=FILE.npy (repeat per input) or --input FILE.npz")
    return feeds


@main.command("fetch")
@click.argument("ref", metavar="MODEL/COMPONENT")
@click.option("--explain", is_flag=True, help="Print why this artifact was chosen.")
@_ref_opts
def fetch_cmd(ref, explain, precision, device, target, store, channel, trusted_root, model_version):
    """Fetch and verify the artifact `run` would use, into the local cache (for offline use later)."""
    from enginefarm.runner.load import fetch

    with _RichProgress() as progress:
        manifest, path, why = fetch(ref, precision, device, store, target=target, progress=progress, channel=channel, trusted_root=trusted_root,
                                    version=model_version)
    if explain:
        click.echo(why)
    click.echo(f"{manifest.ref} {manifest.target} {manifest.precision} [{manifest.build_key[:12]}] → {path}")


@main.command("doctor")
def doctor_cmd():
    """Show every device probe and every backend, with the reason when something is missing."""
    from rich.markup import escape
    from rich.table import Table

    from enginefarm.backends import all_backends, availability
    from enginefarm.cache.manifest import Target
    from enginefarm.runner.device import run_probes

    settings = load_settings()
    console = _console()
    devices = Table(title="devices")
    for column in ("probe", "found", "class", "targets"):
        devices.add_column(column)
    for probe in run_probes():
        if not probe.devices:
            devices.add_row(probe.name, f"[dim]{escape(probe.reason or '')}[/]", "", "")
        for d in probe.devices:
            devices.add_row(probe.name, d.name, d.bench_class, ", ".join(d.targets))
    console.print(devices)
    backends = Table(title="backends")
    for column in ("backend", "versions", "status"):
        backends.add_column(column)
    for backend in all_backends():
        avail = availability(Target(backend.name, backend.example_device))
        try:
            versions = ", ".join(f"{k} {v}" for k, v in backend.versions().items())
        except Exception:
            versions = "-"
        hint = "" if backend.install in (avail.reason or "") else f" ({backend.install})"
        status = "[green]build + load[/]" if avail.can_build and avail.can_load else f"[dim]unavailable: {escape((avail.reason or '') + hint)}[/]"
        if avail.can_build and not avail.can_load:  # TensorRT-RTX builds on a CPU and runs elsewhere
            status = f"[yellow]build only[/]: {escape(avail.reason or '')}"
        backends.add_row(backend.name, versions, status)
    console.print(backends)
    console.print(f"store: {settings.store}\ncache: {settings.home}{'  (offline)' if settings.offline else ''}")


@main.command("publish")
@click.option("--from", "source", metavar="URL", required=True, help="Store to copy from.")
@click.option("--to", "dest", metavar="URL", required=True, help="Store to copy to (a directory or s3://).")
@click.option("--model", "models", multiple=True, metavar="NAME", help="Only this model (required when --from is https://). Repeatable.")
@click.option("--component", "components", multiple=True, metavar="NAME")
@click.option("--target", "targets", multiple=True, metavar="T", help="backend:device or backend.")
@click.option("--precision", "precisions", multiple=True, type=click.Choice(["fp32", "fp16", "bf16"]))
@click.option("--key", "keys", multiple=True, metavar="KEY", help="Build key or its prefix.")
def publish_cmd(source, dest, models, components, targets, precisions, keys):
    """Copy artifacts between stores (local → S3, say), uploading only the blobs the destination lacks."""
    from enginefarm.cache.artifacts import copy_artifacts, select_entries
    from enginefarm.cache.stores import open_store

    src, dst = open_store(source), open_store(dest)
    selected = [entry.build_key for entry in select_entries(src, models, components, targets, precisions, keys)]
    if not selected:
        from enginefarm.errors import ArtifactNotFoundError

        raise ArtifactNotFoundError(f"nothing in {src.url} matches the selection", hint="see `enginefarm ls --store URL`")
    with _RichProgress() as progress:
        results = copy_artifacts(src, dst, selected, progress=progress)
    copied = sum(v == "copied" for v in results.values())
    click.echo(f"{copied} copied, {len(results) - copied} already in {dst.url}")


@main.command("report")
@click.option("--store", metavar="URL", help="The store to report on (default ENGINEFARM_STORE).")
@click.option("--reports", "reports", multiple=True, type=click.Path(exists=True, path_type=Path), help="Build result JSON files (from `build --report`) or folders of them. Repeatable.")
@click.option("--recipe", "recipes", multiple=True, type=click.Path(path_type=Path), help="Recipes whose jobs should exist: the ones not built show as missing. Repeatable.")
@click.option("--runners", type=click.Path(path_type=Path), help="The farm's runners file, so missing jobs say why.")
@click.option("--out", type=click.Path(path_type=Path), default=Path("farm-report"), show_default=True)
@click.option("--title", default="enginefarm build report", show_default=True)
def report_cmd(store, reports, recipes, runners, out, title):
    """Write an HTML report (status grid, validation, latency plots, build times, sizes) and a markdown summary."""
    from enginefarm.builder.report import collect, write_report
    from enginefarm.cache.stores import open_store

    opened = open_store(store or load_settings().store)
    files = [f for p in reports for f in (sorted(p.glob("*.json")) if p.is_dir() else [p])]
    expected = []
    if recipes:
        planned, _, _ = _plan(recipes, store, (), (), (), runners=runners)
        expected = [{**p.to_dict(), "why": p.status} for p in planned if not p.built]
    rows = collect(opened, files, expected)
    counts = write_report(rows, out, title)
    click.echo(f"{counts['built']} built, {counts['failed']} failed, {counts['missing']} missing → {out / 'report.html'}, {out / 'summary.md'}")


@main.command("gc")
@click.option("--store", metavar="URL", required=True)
@click.option("--grace", default="24h", show_default=True, help="Keep unreferenced blobs younger than this (s, m, h, d).")
@click.option("--keep-versions", type=click.IntRange(min=1), metavar="N",
              help="Also remove every model version but the N newest of each component: manifests, index entries, and blobs nothing kept uses.")
@click.option("--delete", is_flag=True, help="Really delete; without it, only show what would go.")
def gc_cmd(store, grace, keep_versions, delete):
    """Remove blobs no manifest references and superseded build-cache objects, older than the grace period (dry run by default).

    With --keep-versions N, first the artifacts of older model versions (a blob a kept manifest uses is never removed)."""
    from enginefarm.cache.artifacts import CACHE_NEWEST_KEPT, plan_gc
    from enginefarm.cache.stores import open_store
    from enginefarm.settings import parse_duration

    grace_s = parse_duration("--grace", grace)
    opened = open_store(store)
    if keep_versions:
        _prune_versions(opened, keep_versions, delete)
    plan = plan_gc(opened, grace_s)
    young = len(plan.unreferenced) - len(plan.to_delete)
    for digest in plan.to_delete:
        if delete:
            opened.delete_blob(digest)
        click.echo(f"{'deleted' if delete else 'would delete'} blob {digest}")
    for name in plan.partials:
        if delete:
            opened.delete_partial(name)
        click.echo(f"{'deleted' if delete else 'would delete'} leftover of an interrupted write: {name}")
    for name in plan.stale_caches:
        if delete:
            opened.delete_cache_object(name)
        click.echo(f"{'deleted' if delete else 'would delete'} build cache caches/{name}")
    click.echo(f"{plan.referenced} blobs referenced; {len(plan.to_delete)} unreferenced {'deleted' if delete else 'to delete (dry run: add --delete)'}; {young} unreferenced but younger than {grace}")
    if plan.stale_caches:
        click.echo(f"{len(plan.stale_caches)} superseded build-cache objects {'deleted' if delete else 'to delete'} (the newest {CACHE_NEWEST_KEPT} of each kept)")
    if plan.partials:
        click.echo(f"{len(plan.partials)} leftovers of interrupted writes {'deleted' if delete else 'to delete'}")


def _prune_versions(opened, keep: int, delete: bool) -> None:
    from enginefarm.cache import prune

    pruning = prune.plan(opened, keep)
    verb = "removed" if delete else "would remove"
    for manifest in pruning.removed:
        click.echo(f"{verb} {manifest.ref} v{manifest.model_version} {manifest.target} {manifest.precision} [{manifest.build_key[:12]}]")
    for digest in pruning.blobs:
        click.echo(f"{verb} blob {digest} (only older versions used it)")
    if delete:
        prune.apply(opened, pruning)
    kept = "; ".join(f"{ref}: {', '.join(versions)}" for ref, versions in pruning.kept_versions.items())
    click.echo(f"{len(pruning.removed)} artifacts of older versions and {len(pruning.blobs)} blobs {'removed' if delete else 'to remove (dry run: add --delete)'}"
               + (f"; kept versions {kept}" if kept else ""))


@main.group("cache")
def cache_group():
    """The local cache on this device (ENGINEFARM_HOME)."""


@cache_group.command("ls")
def cache_ls():
    """List cached artifacts, most recently used first."""
    from rich.table import Table

    from enginefarm.cache.device_cache import DeviceCache

    settings = load_settings()
    cache = DeviceCache(settings.home)
    entries = sorted(cache.entries(), key=lambda e: -e.last_used)
    table = Table(title=f"{len(entries)} cached in {settings.home}")
    for column in ("model/component", "precision", "target", "key", "MiB", "last used"):
        table.add_column(column)
    import time

    for e in entries:
        m = e.manifest
        table.add_row(m.ref, m.precision, m.target, m.build_key[:12], f"{e.size / 2**20:.2f}", time.strftime("%Y-%m-%d %H:%M", time.localtime(e.last_used)))
    _console().print(table)


@cache_group.command("verify")
def cache_verify():
    """Hash every cached file; evict damaged artifacts (they are fetched again when needed)."""
    from enginefarm.cache.device_cache import DeviceCache

    cache = DeviceCache(load_settings().home)
    before = {p.name for p in cache.artifacts.iterdir() if not p.name.startswith(".")} if cache.artifacts.is_dir() else set()
    entries = list(cache.entries())  # reading each manifest checks it; a malformed one is evicted
    bad = len(before - {e.manifest.build_key for e in entries})
    for key in sorted(before - {e.manifest.build_key for e in entries}):
        click.echo(f"evicted [{key[:12]}]: its manifest is missing or malformed")
    for e in entries:
        problems = cache.problems(e.manifest.build_key)
        if problems:
            bad += 1
            cache.evict(e.manifest.build_key)
            click.echo(f"evicted {e.manifest.ref} {e.manifest.target} [{e.manifest.build_key[:12]}]: {'; '.join(problems)}")
        else:
            click.echo(f"ok      {e.manifest.ref} {e.manifest.target} [{e.manifest.build_key[:12]}]")
    if bad:
        sys.exit(1)


@cache_group.command("gc")
@click.option("--quota", metavar="SIZE", help="Shrink to this size (e.g. 5G). Default ENGINEFARM_CACHE_QUOTA.")
@click.option("--keep-versions", type=click.IntRange(min=1), metavar="N", help="Evict every model version but the N newest of each component.")
def cache_gc(quota, keep_versions):
    """Remove stale downloads, artifacts of older model versions (--keep-versions) and least-recently-used artifacts beyond the quota."""
    from enginefarm.cache.device_cache import DeviceCache
    from enginefarm.settings import parse_size

    settings = load_settings()
    limit = parse_size("--quota", quota) if quota else settings.cache_quota
    cache = DeviceCache(settings.home)
    evicted = []
    if keep_versions:
        from enginefarm.cache.prune import prune_cache

        evicted = prune_cache(cache, keep_versions)
        for manifest in evicted:
            click.echo(f"evicted {manifest.ref} v{manifest.model_version} {manifest.target} {manifest.precision} [{manifest.build_key[:12]}]")
    removed = evicted + cache.gc(limit, max_tmp_age=0)  # every leftover of a dead process, whatever its age
    click.echo(f"removed {len(removed)} artifacts; cache holds {cache.size() / 2**20:.1f} MiB" + ("" if limit else " (no quota set)"))


from enginefarm.cli_release import release_group  # noqa: E402  (its own module; registered here)

main.add_command(release_group)

if __name__ == "__main__":
    main()
