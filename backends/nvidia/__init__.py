"""What the TensorRT and TensorRT-RTX backends share (their Python APIs are the same where they overlap), one module
per stage of a plan's life, imported from where each name lives:

- `sdk`: importing the SDK with an install hint; the ILogger that keeps the SDK's own error words.
- `devices`: which NVIDIA GPUs run a target (exact arch or family class), from NVML.
- `backend`: `NvidiaBackend`, the class both backends subclass.
- `build`: a job as a `BuildSpec`, run in a separate process (`build_process`, `python -m`) so an SDK crash fails the
  job, not the farm.
- `plan`: opening a plan: verified bytes only, the SDK's validity check, deserializing, refitting, weight streaming.
- `session`: running an engine on CUDA (`TrtSession`).

Nothing is imported here, so `python -m enginefarm.backends.nvidia.build_process` loads only what the build needs.
"""
