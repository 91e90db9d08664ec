"""Run jobs in separate processes, a few at a time. A crash or out-of-memory kill in a vendor SDK fails its job,
not the run; Ctrl-C or SIGTERM stops the run promptly, terminating the workers and removing their work folders.
Nothing half-built can be visible in the store, because manifests are written last.

Jobs start only while their memory needs (memory.py) fit the budget together: `-j 4` on a 24 GB machine runs
four small jobs at once but one SD UNet at a time. A job that needs more than the whole budget still runs, alone;
one that needs more than the machine has in all is not started unless `--memory` asks for it (memory.too_big_here
says where it would fit: T5-XXL's fp16 job needs 38 GB).
When the run ends, work-cache folders unused for a day are removed (workcache.py).
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from multiprocessing.context import SpawnProcess
from pathlib import Path

from enginefarm.cache.progress import Progress
from enginefarm.cache.workdirs import reclaim

from .build import BuildResult, build
from .job import Job
from .memory import available_bytes, gb, job_need_bytes, too_big_here, total_bytes
from .workcache import prune

# (job id, event, detail): event is "start", "step", "transfer" or "done"; detail is a step name,
# (name, bytes done, bytes total) or a BuildResult.
Event = Callable[[str, str, object], None]


class _Uploads(Progress):
    """Forwards upload progress to the parent, at most every 0.2 s, so a slow link shows bytes moving."""

    def __init__(self, job_id: str, pipe) -> None:
        self.job_id, self.pipe, self.last = job_id, pipe, 0.0

    def transfer(self, name: str, done: int, total: int) -> None:
        now = time.monotonic()
        if done >= total or now - self.last > 0.2:
            self.last = now
            self.pipe.send((self.job_id, "transfer", (name, done, total)))


def _child(job: Job, store_url: str, workroot: str, bench: bool, validate_only: bool, pipe) -> None:
    from enginefarm.cache.stores import open_store

    pipe.send((job.id, "start", job.label))
    result = build(
        job,
        open_store(store_url),
        Path(workroot),
        bench=bench,
        step=lambda msg: pipe.send((job.id, "step", msg)),
        progress=_Uploads(job.id, pipe),
        validate_only=validate_only,
    )
    result.manifest = None  # keep what crosses the process boundary small
    pipe.send((job.id, "result", result))


def run_jobs(
    jobs: list[Job],
    store_url: str,
    workroot: Path,
    *,
    parallel: int = 1,
    bench: bool = True,
    on_event: Event | None = None,
    memory: int | None = None,
    validate_only: bool = False,
) -> list[BuildResult]:
    """`memory`: bytes the jobs may use together (default: what the machine has available when the run starts).
    `validate_only`: re-validate the stored artifacts against the jobs' current [validate]; build nothing."""
    on_event = on_event or (lambda *_: None)
    reclaim(workroot / "jobs")  # what builds killed earlier left behind (their processes are gone)
    budget = memory if memory is not None else available_bytes()
    needs = {job.id: job_need_bytes(job) for job in jobs}
    told: set[str] = set()  # jobs already shown as waiting for memory
    # Without an explicit budget, a job over the machine's whole memory is not started (an explicit one may try).
    over = {} if memory is not None else {job.id: too_big_here(needs[job.id], total_bytes()) for job in jobs}
    context = mp.get_context("spawn")  # vendor SDKs hold threads and GPU contexts that do not survive fork
    waiting = list(jobs)
    # One pipe per worker, written from its main thread: a worker killed mid-message breaks only its own pipe. (A
    # shared multiprocessing.Queue has one write lock; a worker killed while holding it would block every other.)
    running: dict[str, tuple[SpawnProcess, Job, Connection]] = {}
    results: dict[str, BuildResult] = {}

    def finish(job: Job, result: BuildResult) -> None:
        results[job.id] = result
        on_event(job.id, "done", result)

    try:
        for refused in [j for j in waiting if over.get(j.id)]:
            waiting.remove(refused)
            finish(refused, BuildResult.of(refused, None, "failed", over[refused.id]))
        while waiting or running:
            while waiting and len(running) < max(1, parallel):
                in_use = sum(needs[job_id] for job_id in running)
                job = next((j for j in waiting if not running or in_use + needs[j.id] <= budget), None)
                if job is None:  # the next jobs wait for memory, not for a free slot
                    _say_waiting(waiting, in_use, budget, needs, told, on_event)
                    break
                waiting.remove(job)
                reader, writer = context.Pipe(duplex=False)
                process = context.Process(
                    target=_child, args=(job, store_url, str(workroot), bench, validate_only, writer), daemon=True
                )
                process.start()
                writer.close()  # the worker holds the only writer: its exit is the reader's end of file
                running[job.id] = (process, job, reader)
            ready = wait([reader for _, _, reader in running.values()], timeout=0.2)
            for job_id, (process, job, reader) in list(running.items()):
                if reader not in ready and process.is_alive():
                    continue
                if _read(reader, job_id, finish, on_event, job) and process.is_alive():
                    continue  # more to come
                process.join(timeout=30)
                if job_id not in results:  # it died without a word: a crash or a kill
                    finish(
                        job, BuildResult.of(job, None, "failed", f"build process died (exit code {process.exitcode})")
                    )
                reader.close()
                running.pop(job_id)
    except BaseException:
        for process, _, _ in running.values():
            process.terminate()
        for process, _, _ in running.values():
            process.join(timeout=10)
        reclaim(workroot / "jobs")  # the terminated workers' folders (their processes are gone now)
        raise
    prune(workroot)
    return [results[job.id] for job in jobs if job.id in results]


def _say_waiting(waiting, in_use: int, budget: int, needs, told: set[str], on_event) -> None:
    for job in waiting:
        if job.id not in told:
            told.add(job.id)
            on_event(
                job.id,
                "step",
                f"waiting for memory (needs {gb(needs[job.id]):g} GB; {gb(in_use):g} of {gb(budget):g} GB taken)",
            )


def _read(reader, job_id: str, finish, on_event, job: Job) -> bool:
    """Handle what the worker sent. False when its pipe is closed (it exited, or died mid-message) or its result
    came."""
    while reader.poll():
        try:
            _, kind, detail = reader.recv()
        except Exception:  # end of file, or a message cut short by the worker's death
            return False
        if kind == "result":
            finish(job, detail)
            return False
        on_event(job_id, kind, detail)
    return True
