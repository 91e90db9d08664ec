"""The session an app holds: checks inputs against the artifact's profile, runs, and explains its choice."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from enginefarm.errors import EnginefarmError, InputError, SessionClosed
from enginefarm.hardware.rss import give_back_memory

if TYPE_CHECKING:
    from enginefarm.cache.manifest import Manifest


def _fits(array: np.ndarray, dtype: np.dtype) -> bool:
    if array.size == 0 or np.can_cast(array.dtype, dtype, casting="safe"):
        return True
    info = np.iinfo(dtype)
    return bool(array.min() >= info.min and array.max() <= info.max)


class Session:
    """An artifact loaded on a device. `close()` (or leaving a `with enginefarm.load(...) as s:` block) gives its
    memory back at once instead of whenever the garbage collector gets to it; a closed session refuses to run."""

    def __init__(self, backend_session: Any, manifest: Manifest, explanation: str) -> None:
        self._session = backend_session
        self._artifact: Manifest | None = manifest
        self._manifest_bytes: tuple[bytes, str] | None = None
        self._explanation = explanation
        self._facts(manifest.ref, manifest.target, manifest.precision, manifest.profile, manifest.io)
        self._bindings: list[Binding] = []  # closed with the session: each holds the backend session

    @classmethod
    def reopened(
        cls, backend_session: Any, facts: dict[str, Any], manifest: bytes, build_key: str, explanation: str
    ) -> Session:
        """A session of a remembered pick (runner/warm.py): what runs and checks inputs comes from `facts` (ref,
        target, precision, profile, io, as the manifest says them); the manifest's bytes, read with the artifact, are
        parsed when `artifact` is first asked for (an eviction meanwhile cannot take them away)."""
        self = cls.__new__(cls)
        self._session, self._artifact, self._explanation = backend_session, None, explanation
        self._manifest_bytes = (manifest, build_key)
        self._facts(facts["ref"], facts["target"], facts["precision"], facts["profile"], facts["io"])
        self._bindings = []
        return self

    def _facts(self, ref: str, target: str, precision: str, profile: dict, io: dict) -> None:
        self._ref, self._target, self._precision, self._profile, self._io = ref, target, precision, profile, io
        self._inputs = {t["name"]: t for t in io.get("inputs", [])}

    def _reopen_plan(self) -> dict | None:
        """How the backend opens this session again (runner/warm.py); None when it cannot say."""
        return getattr(self._session, "reopen_plan", None)

    @property
    def artifact(self) -> Manifest:
        """The loaded artifact's manifest: its ref, target, precision, profile (min/opt/max per input) and files."""
        if self._artifact is None:
            from enginefarm.cache.manifest import Manifest

            assert self._manifest_bytes is not None  # one of the two is always set
            raw, key = self._manifest_bytes
            self._artifact = Manifest.from_json(raw, expect_key=key)
        return self._artifact

    @property
    def input_names(self) -> list[str]:
        """The names `run` takes, in the model's order."""
        return list(self._inputs) or list(getattr(self._session, "input_names", []))

    @property
    def output_names(self) -> list[str]:
        """The names `run` returns, in the model's order (read from the manifest once the session is closed)."""
        if self._session is None:
            return [t["name"] for t in self._io.get("outputs", [])]
        return list(self._session.output_names)

    @property
    def compute_precision(self) -> str:
        """What the backend really computes in ("fp32", "fp16", "bf16"), which can differ from the artifact's
        precision (OpenVINO runs an fp16 or bf16 artifact in f32 on a CPU that lacks it); "unknown" when the backend
        does not say."""
        return getattr(self._session, "compute_precision", "unknown")

    def explain(self) -> str:
        """Why this artifact was chosen (the devices, the rule that chose it, the candidates also considered), what
        it computes in, and how the backend opened it."""
        how = getattr(self._session, "how", "")  # how the backend opened it: "compiled IR", "streaming weights: …"
        return (
            self._explanation
            + f"\nruns in {self.compute_precision} ({self._target}, {self._precision} artifact)"
            + (f"\nopened: {how}" if how else "")
        )

    @property
    def closed(self) -> bool:
        """True after `close()`: the session then refuses to run."""
        return self._session is None

    def close(self) -> None:
        """Release the backend's session (its weights, compiled code and device buffers) and hand the freed heap
        back to the system. Closing twice is harmless."""
        backend_session, self._session = self._session, None
        if backend_session is None:
            return
        while self._bindings:
            self._bindings.pop().close()
        close = getattr(backend_session, "close", None)
        if close is not None:
            close()
        del backend_session, close
        give_back_memory()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _open(self) -> Any:
        if self._session is None:
            raise SessionClosed(f"{self._ref}: this session is closed", hint="load it again with enginefarm.load(...)")
        return self._session

    def bind(self, fixed: Mapping[str, np.ndarray] | None = None) -> Binding:
        """Calls that share inputs (a denoising loop's text states): `fixed` is checked and placed on the device once,
        and each `Binding.run` takes the other inputs only. Outputs named in its `keep=` stay on the device as
        `DeviceTensor`s that a later run takes as inputs. Results are those of `run`, bit for bit; backends that
        cannot keep tensors on a device run through numpy (`enginefarm.runner.binding`)."""
        from enginefarm.runner.binding import HostBinding

        backend_session = self._open()
        checked = self._checked(fixed or {}, partial=True)
        bind = getattr(backend_session, "bind", None)
        inner = bind(checked) if bind is not None else HostBinding(backend_session, checked)
        binding = Binding(self, inner, tuple(checked))
        self._bindings.append(binding)
        return binding

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the artifact once: `feeds` maps every input name to an array, the result maps every output name to a
        numpy array.

        Inputs are checked before the backend sees them: a missing or unknown name, an integer array for a float input,
        or a shape outside the artifact's profile raises `InputError`, whose hint names the inputs, the dtype or the
        profile. float64 is cast to float32, and int64 to int32 when every value fits. Inputs inside the profile that
        the backend still refuses (a model's stride rule) come back as an `InputError` naming the rule. A closed session
        raises `SessionClosed`."""
        self._open()
        checked = self._checked(feeds)
        try:
            return self._session.run(checked)
        except EnginefarmError:
            raise
        except Exception as exc:  # the SDK refused inputs that passed our checks: say which rule they broke
            raise self._refused(checked, exc) from exc

    def _refused(self, feeds: dict[str, np.ndarray], exc: Exception) -> InputError:
        """Inputs inside the profile can still break a model's own rules, a stride above all (a detector that halves
        its input five times wants multiples of 32). The profile's min/opt/max, which validation ran, show the rule."""
        ref, shapes = self._ref, {name: list(array.shape) for name, array in feeds.items()}
        # OpenVINO opens with lines that name its own source files ("Exception from src/…cpp:224:"): skip those.
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        first = next(
            (line for line in lines if not re.match(r"^(Exception from|Check '.*' failed at) src/", line)),
            lines[0] if lines else type(exc).__name__,
        )
        broken = []
        for name, shape in shapes.items():
            bounds = self._profile.get(name)
            if bounds is None:
                continue
            for axis, (size, lo, opt, hi) in enumerate(
                zip(shape, bounds["min"], bounds["opt"], bounds["max"], strict=True)
            ):
                step = math.gcd(lo, math.gcd(opt, hi))
                if lo != hi and step > 1 and size % step:
                    below, above = size - size % step, size - size % step + step
                    nearest = " or ".join(str(v) for v in (below, above) if lo <= v <= hi)
                    broken.append(
                        f"{name} axis {axis} is {size}, every validated size is a multiple of {step} (try {nearest})"
                    )
        validated = "; ".join(f"{n}: {b['min']}, {b['opt']}, {b['max']}" for n, b in self._profile.items())
        if broken:
            return InputError(
                f"{ref}: the model cannot run inputs of shape {shapes}: {'; '.join(broken)}",
                hint=f"the backend said: {first[:300]}",
            )
        return InputError(
            f"{ref}: the {self._target} artifact cannot run inputs of shape {shapes} ({type(exc).__name__}: "
            f"{first[:300]})",
            hint=f"shapes validated when it was built: {validated}; the model may need sizes like those",
        )

    def _checked(self, feeds: Mapping[str, Any], partial: bool = False, bound: tuple[str, ...] = ()) -> dict[str, Any]:
        """Feeds checked and cast. partial: some inputs may be missing (a binding's fixed ones); bound: inputs a
        binding already holds, which the feeds must not repeat. A DeviceTensor is checked by its shape only."""
        from enginefarm.hardware.tensors import DeviceTensor

        ref = self._ref
        if not isinstance(feeds, Mapping):
            names = ", ".join(self.input_names)
            example = f'{{"{self.input_names[0]}": array}}' if self.input_names else "{name: array}"
            raise InputError(
                f"{ref}: run() takes a dict of input name → array, got {type(feeds).__name__}",
                hint=f"session.run({example}); this model's inputs: {names}",
            )
        missing = [] if partial else [n for n in self.input_names if n not in feeds and n not in bound]
        unknown = [n for n in feeds if n not in self.input_names]
        again = [n for n in feeds if n in bound]
        if missing or unknown or again:
            parts = (
                ([f"missing {missing}"] if missing else [])
                + ([f"unknown {unknown}"] if unknown else [])
                + ([f"already bound {again}"] if again else [])
            )
            raise InputError(
                f"{ref}: inputs {', '.join(parts)}",
                hint=f"inputs are: {', '.join(self.input_names)}"
                + (f"; bound by bind(): {', '.join(bound)}" if bound else ""),
            )
        out: dict[str, np.ndarray | DeviceTensor] = {}
        for name, value in feeds.items():
            if isinstance(value, DeviceTensor):
                bounds = self._profile.get(name)
                if bounds is not None:
                    self._check_shape(ref, name, value.shape, bounds)
                out[name] = value
                continue
            array = np.asarray(value)
            info = self._inputs.get(name)
            if info is not None:
                array = self._cast(ref, name, array, info["dtype"])
            bounds = self._profile.get(name)
            if bounds is not None:
                self._check_shape(ref, name, array.shape, bounds)
            out[name] = np.ascontiguousarray(array)
        return out

    @staticmethod
    def _cast(ref: str, name: str, array: np.ndarray, dtype: str) -> np.ndarray:
        """Within a kind only: float64 → float32, int64 → int32 when every value fits. Integers into a float input
        are refused: a uint8 image fed as 0..255 to a model that expects -1..1 runs and returns garbage."""
        want = np.dtype(dtype)
        if array.dtype == want:
            return array
        if array.dtype.kind == want.kind == "f" or (
            array.dtype.kind in "iu" and want.kind in "iu" and _fits(array, want)
        ):
            return array.astype(want)
        if array.dtype.kind in "iub" and want.kind == "f":
            raise InputError(
                f"{ref}: input {name!r} is {array.dtype}, the model takes {dtype}: converting would keep the values "
                f"({array.dtype} range) where the model may expect another scale",
                hint=f"convert it yourself, e.g. {name}.astype(np.{dtype}) / 255 for an image the model expects in "
                "[0, 1]",
            )
        raise InputError(
            f"{ref}: input {name!r} is {array.dtype}, the model takes {dtype}",
            hint=f"pass {dtype}; other dtypes are converted only within their kind "
            "(float64 -> float32; int64 -> int32 when every value fits)",
        )

    @staticmethod
    def _check_shape(ref: str, name: str, shape: tuple[int, ...], bounds: dict[str, list[int]]) -> None:
        lo, hi = bounds["min"], bounds["max"]
        if len(shape) != len(lo) or any(s < a or s > b for s, a, b in zip(shape, lo, hi, strict=True)):
            raise InputError(
                f"{ref}: input {name!r} has shape {list(shape)}, outside the artifact's profile {lo} .. {hi}",
                hint="use a shape inside the profile, or add a profile that covers it to the recipe",
            )


class Binding:
    """A session's calls with some inputs fixed on the device (`Session.bind`). Close it, or leave its `with` block,
    to free what it holds; closing the session closes it too."""

    def __init__(self, session: Session, inner: Any, fixed: tuple[str, ...]) -> None:
        self._owner = session
        self._inner = inner
        self.fixed = fixed  # the input names bound once
        self.kind = getattr(
            inner, "name", "device"
        )  # "device": inputs and kept outputs stay on the device; "host": numpy

    def run(self, feeds: Mapping[str, Any], keep: tuple[str, ...] = ()) -> dict[str, Any]:
        """The outputs for these inputs plus the fixed ones: numpy arrays, and DeviceTensors for the names in `keep`."""
        owner = self._owner
        owner._open()
        if self._inner is None:
            raise SessionClosed(f"{owner._ref}: this binding is closed", hint="make another with session.bind(...)")
        keep = (keep,) if isinstance(keep, str) else tuple(keep)
        unknown = [name for name in keep if name not in owner.output_names]
        if unknown:
            raise InputError(
                f"{owner._ref}: keep={unknown} names no output",
                hint=f"outputs are: {', '.join(owner.output_names)}",
            )
        checked = owner._checked(feeds, bound=self.fixed)
        try:
            return self._inner.run(checked, keep)
        except EnginefarmError:
            raise
        except Exception as exc:
            raise owner._refused({n: v for n, v in checked.items() if isinstance(v, np.ndarray)}, exc) from exc

    def close(self) -> None:
        """Free what the binding holds on the device. Closing twice is harmless; the session stays open."""
        inner, self._inner = self._inner, None
        if inner is not None:
            inner.close()
            if self in self._owner._bindings:
                self._owner._bindings.remove(self)

    def __enter__(self) -> Binding:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
