"""The executor reports each job's steps and upload bytes to the caller, from the worker processes."""

from __future__ import annotations

from enginefarm.builder.executor import run_jobs
from enginefarm.builder.planner import plan
from enginefarm.builder.recipe import load_recipe


def test_progress_events_cross_the_process_boundary(tiny_recipe, tmp_path):
    planned = plan([load_recipe(tiny_recipe(precisions=("fp32", "fp16")))], tmp_path / "dl")
    events: list[tuple[str, str, object]] = []
    results = run_jobs([p.job for p in planned], str(tmp_path / "store"), tmp_path / "work", parallel=2, bench=False,
                       on_event=lambda job_id, kind, detail: events.append((job_id, kind, detail)))
    assert [r.status for r in results] == ["built", "built"]
    for p in planned:
        kinds = [kind for job_id, kind, _ in events if job_id == p.job.id]
        assert kinds[0] == "start" and kinds[-1] == "done"
        assert {"prep", "validate", "publish"} <= {d for job_id, kind, d in events if job_id == p.job.id and kind == "step"}
        uploads = [d for job_id, kind, d in events if job_id == p.job.id and kind == "transfer"]
        assert uploads and uploads[-1][1] == uploads[-1][2] > 0  # the last report says every byte went up
