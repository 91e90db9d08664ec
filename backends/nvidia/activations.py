"""One activation buffer for the TensorRT engines of a pipeline, as TensorRT's demo/Diffusion shares one: its stages
run one after another, so the text encoders, the UNet and the VAE can use the same device memory for their
intermediate tensors. Each engine's context is made without device memory of its own (USER_MANAGED) and is given the
shared buffer, sized to the largest `device_memory_size_v2` of the engines using it, before each run.

A pipeline opens its components inside `sharing(pool)`; an engine opened outside one keeps its own (STATIC), as before.
Two engines of one pool must never run at the same time (a pipeline's stages do not)."""

from __future__ import annotations

import contextlib
import contextvars

from ..device_memory import DeviceMemory

_POOL: contextvars.ContextVar[SharedActivations | None] = contextvars.ContextVar("shared_activations", default=None)


class SharedActivations:
    """The shared buffer: members join with their activation size; it is allocated at the first run, grows when a
    larger member joins, shrinks when the largest leaves, and is freed when the last one does."""

    def __init__(self) -> None:
        self.sizes: dict[int, int] = {}  # id(member) → its activation bytes
        self._pointer, self._capacity, self._rt = 0, 0, None

    @property
    def size(self) -> int:
        """The bytes the buffer needs: the largest member's activations."""
        return max(self.sizes.values(), default=0)

    @property
    def allocated(self) -> int:
        """The bytes allocated now (0 until a member first runs, and after the largest leaves until the next run)."""
        return self._capacity

    def join(self, member: object, nbytes: int) -> None:
        """`member` (a session) runs in this buffer and needs `nbytes` of it."""
        self.sizes[id(member)] = int(nbytes)

    def leave(self, member: object) -> None:
        self.sizes.pop(id(member), None)
        if self._capacity > self.size:  # what the largest member needed goes back now, not at the next run
            self._free()

    def bind(self, context, rt) -> None:
        """Give a member's context the buffer, (re)allocated to the largest member's size first (`rt`: cudart)."""
        need = max(self.size, 1)
        if self._capacity < need:
            self._free()
            status, pointer = rt.cudaMalloc(need)
            if int(status) != 0:
                raise MemoryError(
                    f"the GPU has no {need} bytes free for the activations its engines share (cudaMalloc: {status}); "
                    "a memory_budget closes the components a stage does not need first"
                )
            self._pointer, self._capacity, self._rt = int(pointer), need, rt
        if hasattr(context, "set_device_memory"):  # TensorRT 10.1+ and TensorRT-RTX
            context.set_device_memory(self._pointer, self._capacity)
        else:
            context.device_memory = self._pointer

    def _free(self) -> None:
        if self._pointer and self._rt is not None:
            self._rt.cudaFree(self._pointer)
        self._pointer, self._capacity = 0, 0


@contextlib.contextmanager
def sharing(pool: SharedActivations):
    """Engines opened inside share `pool`'s buffer."""
    token = _POOL.set(pool)
    try:
        yield pool
    finally:
        _POOL.reset(token)


def current() -> SharedActivations | None:
    """The pool engines opened here share, if any."""
    return _POOL.get()


def new_context(trt, engine, runtime_config=None):
    """(context, pool): a context without device memory of its own when a pool is shared here, else one that
    allocates its own. `runtime_config`: TensorRT-RTX's, which carries the allocation strategy."""
    pool = current()
    if pool is None:
        if runtime_config is not None:
            return engine.create_execution_context(runtime_config), None
        return engine.create_execution_context(), None
    user_managed = trt.ExecutionContextAllocationStrategy.USER_MANAGED
    if runtime_config is not None:
        runtime_config.set_execution_context_allocation_strategy(user_managed)
        return engine.create_execution_context(runtime_config), pool
    return engine.create_execution_context(user_managed), pool


def plan_size(manifest) -> int:
    """The bytes of the artifact's plan (engine) file, from its manifest."""
    return next((int(f.size) for f in manifest.files if f.role == "engine"), 0)


def engine_memory(trt, engine, plan_bytes: int = 0, shared: bool = False) -> DeviceMemory:
    """The engine's device memory as the SDK reports it: weights from get_engine_stat(TOTAL_WEIGHTS_SIZE) (TensorRT
    10.8+, TensorRT-RTX), else the plan file's size (which holds them, and kernels besides); activations from
    device_memory_size_v2 (the largest over its profiles). A weight-streaming engine keeps only its budget of the
    streamable weights on the GPU."""
    weights = -1
    stat = getattr(getattr(trt, "EngineStat", None), "TOTAL_WEIGHTS_SIZE", None)
    if stat is not None and hasattr(engine, "get_engine_stat"):
        weights = int(engine.get_engine_stat(stat))
    if weights < 0:
        weights = plan_bytes
    streamable = int(getattr(engine, "streamable_weights_size", 0) or 0)
    budget = int(getattr(engine, "weight_streaming_budget_v2", -1) if streamable else -1)
    if streamable and 0 <= budget < streamable:
        weights -= streamable - budget
    if hasattr(engine, "device_memory_size_v2"):  # TensorRT 10+, TensorRT-RTX
        activations = int(engine.device_memory_size_v2)
        # Any run may select any profile (profiles.py), so the buffer is the largest profile's, asked per profile too.
        profiles = int(getattr(engine, "num_optimization_profiles", 1) or 1)
        if profiles > 1 and hasattr(engine, "get_device_memory_size_for_profile_v2"):
            activations = max(
                activations, *(int(engine.get_device_memory_size_for_profile_v2(i)) for i in range(profiles))
            )
    else:
        activations = int(getattr(engine, "device_memory_size", 0))
    return DeviceMemory(weights=weights, activations=activations, shared=shared)
