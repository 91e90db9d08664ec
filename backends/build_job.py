"""The shape of a job as backends read it. Two kinds of job reach a backend: the planner's `Job` (builder/job.py),
built by a farm worker, and the runner's `DeviceJob` (runner/recompile.py), an engine compiled on the user's device
from a stored ONNX artifact. Backends type their `build`, `constraints` and job checks with these Protocols, so
neither job type is imported by a backend and both are checked against one description (tests/backends).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from enginefarm.cache.manifest import Target


@runtime_checkable
class BuildJob(Protocol):
    """What every job has: what `build` and `constraints` may read."""

    @property
    def label(self) -> str: ...  # for log lines and errors: "tiny-sd/unet fp16 default tensorrt:sm_89"

    @property
    def component(self) -> str: ...

    @property
    def target(self) -> Target: ...

    @property
    def precision(self) -> str: ...

    @property
    def profile(self) -> Mapping[str, Mapping[str, Sequence[int]]]: ...  # input → {"min", "opt", "max"} shapes

    @property
    def options(self) -> Mapping[str, Any]: ...  # the backend's build options, defaults filled in

    @property
    def fp16_keep(
        self,
    ) -> Sequence[str]: ...  # op types, node names or `input:NAME` paths the recipe keeps fp32 at fp16


@runtime_checkable
class PlannedJob(BuildJob, Protocol):
    """A farm job also knows its source model and I/O: what `refusal`, `check_job` and builds that start from the
    source (Core ML traces the PyTorch model) read. Only the planner makes these."""

    @property
    def inputs(self) -> Sequence[Any]: ...  # TensorInfo: name, dtype, dims

    @property
    def outputs(self) -> Sequence[Any]: ...

    @property
    def source(self) -> Any: ...  # LocalSource: the source model's folder (`.path`)
