"""The executor reports each job's steps and upload bytes to the caller, from the worker processes."""

from __future__ import annotations

from enginefarm.builder.executor import run_jobs
from enginefarm.builder.planner import plan
from enginefarm.builder.recipe import load_recipe


def test_progress_events_cross_the_process_boundary(tiny_recipe, tmp_path):
    planned = plan([load_recipe(tiny_recipe(precisions=("fp32", "fp16")))], tmp_path / "dl")
    events: list[tuple[str, str, object]] = []
    results = run_jobs(
        [p.job for p in planned],
        str(tmp_path / "store"),
        tmp_path / "work",
        parallel=2,
        bench=False,
        on_event=lambda job_id, kind, detail: events.append((job_id, kind, detail)),
    )
    assert [r.status for r in results] == ["built", "built"]
    for p in planned:
        kinds = [kind for job_id, kind, _ in events if job_id == p.job.id]
        assert kinds[0] == "start" and kinds[-1] == "done"
        assert {"prep", "validate", "publish"} <= {
            d for job_id, kind, d in events if job_id == p.job.id and kind == "step"
        }
        uploads = [d for job_id, kind, d in events if job_id == p.job.id and kind == "transfer"]
        assert uploads and uploads[-1][1] == uploads[-1][2] > 0  # the last report says every byte went up


def test_a_crash_while_benchmarking_fails_its_job_with_the_reason(tiny_recipe, tmp_path, monkeypatch):
    """The benchmark runs in its own process; if that process dies, the job fails (nothing published) and says why."""
    import os

    from enginefarm.builder.build import build
    from enginefarm.cache.stores.local import LocalStore

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os, sys\nif 'enginefarm.builder.bench' in sys.orig_argv:\n    os._exit(3)\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    (job,) = [p.job for p in plan([load_recipe(tiny_recipe())], tmp_path / "dl")]
    store = LocalStore(tmp_path / "store")
    result = build(job, store, tmp_path / "work", bench=True)
    assert result.status == "failed"
    assert result.reason == (
        f"{job.label}: the benchmark process failed: exit status 3, no output "
        "(hint: build with --no-bench to publish without a benchmark)"
    )
    assert store.get_manifest_bytes(result.key) is None
