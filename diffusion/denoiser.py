"""The denoiser's calls in a step loop: what stays the same for a whole image (the text states, SDXL's pooled text
and time ids, Flux's guidance and ids) is bound to the session once (`Session.bind`), so each step hands over only
the latent and the timestep; the results are bit for bit those of `Session.run`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from enginefarm.runner.session import Binding

STEP_INPUTS = ("sample", "hidden_states", "timestep")  # what changes from one step to the next


class BoundDenoiser:
    """One image's denoiser calls. `bind=False`: every step through `Session.run`, as before bindings existed."""

    def __init__(self, session, bind: bool = True) -> None:
        self._session, self._bind = session, bind
        self._binding: Binding | None = None

    def __call__(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        if not self._bind:
            return self._session.run(feeds)["out_sample"]
        if self._binding is None:  # the first step: its fixed inputs are those of every step
            self._binding = self._session.bind({n: v for n, v in feeds.items() if n not in STEP_INPUTS})
        return self._binding.run({n: v for n, v in feeds.items() if n in STEP_INPUTS})["out_sample"]

    def close(self) -> None:
        if self._binding is not None:
            self._binding.close()
            self._binding = None

    def __enter__(self) -> BoundDenoiser:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
