"""Run jobs in a local process pool. Each job runs in its own process, so an SDK crash fails one job, not the run.

Ctrl-C or SIGTERM stops the run promptly: workers are terminated and their half-built work folders removed.
Nothing half-built can be visible in the store, because manifests are written last.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import shutil
import threading
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Callable

from .build import BuildResult, build
from .planner import Job

# (job id, event, detail): event is "start", "step" or "done"; detail is a step name or a BuildResult.
Event = Callable[[str, str, object], None]

_events = None  # the queue a worker reports progress on, set by _init_worker


def _init_worker(events) -> None:
    global _events
    _events = events


def _worker(job: Job, store_url: str, workroot: str, bench: bool) -> BuildResult:
    from enginefarm.cache.stores import open_store

    _events.put((job.id, "start", job.label))
    result = build(job, open_store(store_url), Path(workroot), bench=bench, step=lambda msg: _events.put((job.id, "step", msg)))
    result.manifest = None  # keep what crosses the process boundary small
    return result


def run_jobs(jobs: list[Job], store_url: str, workroot: Path, *, parallel: int = 1, bench: bool = True, on_event: Event | None = None) -> list[BuildResult]:
    on_event = on_event or (lambda *_: None)
    context = mp.get_context("spawn")  # vendor SDKs hold threads and GPU contexts that do not survive fork
    events = context.Queue()
    stop = threading.Event()

    def pump() -> None:
        while not stop.is_set():
            try:
                job_id, kind, detail = events.get(timeout=0.1)
            except queue.Empty:
                continue
            except (EOFError, OSError, ValueError):
                return
            on_event(job_id, kind, detail)

    pumper = threading.Thread(target=pump, daemon=True)
    pumper.start()
    results: list[BuildResult] = []
    pool = ProcessPoolExecutor(max_workers=max(1, parallel), mp_context=context, max_tasks_per_child=1,
                               initializer=_init_worker, initargs=(events,))
    try:
        futures = {pool.submit(_worker, job, store_url, str(workroot), bench): job for job in jobs}
        for future in as_completed(futures):
            job = futures[future]
            try:
                result = future.result()
            except Exception as exc:  # the worker died (segfault, OOM kill) or raised a bug
                result = BuildResult.of(job, None, "failed", f"build process died: {type(exc).__name__}: {exc}")
            results.append(result)
            on_event(job.id, "done", result)
    except BaseException:
        for process in list(getattr(pool, "_processes", {}).values()):
            process.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        _remove_work(jobs, workroot)
        raise
    else:
        pool.shutdown(wait=True)
    finally:
        stop.set()
        pumper.join(timeout=5)
        events.close()
    order = {job.id: i for i, job in enumerate(jobs)}
    return sorted(results, key=lambda r: order.get(r.job_id, 0))


def _remove_work(jobs: list[Job], workroot: Path) -> None:
    for job in jobs:
        try:
            key = job.key(job.toolchain())
        except Exception:
            continue
        shutil.rmtree(workroot / "jobs" / key[:24], ignore_errors=True)
