"""`Pipeline.load` opens a model's components side by side where nothing but stored artifacts on CPU devices is
asked (diffusion/loading.py `open_components`), in turn otherwise; where one fails, those opened are closed."""

from __future__ import annotations

import threading
import time

import pytest

from enginefarm.diffusion.loading import ComponentLoader, open_components
from enginefarm.runner.request import Request


class Session:
    def __init__(self, name: str) -> None:
        self.name, self.closed = name, False

    def close(self) -> None:
        self.closed = True


class Loader:
    """Opens each component after `delay` seconds on the thread it is called from; `failing` raises instead."""

    def __init__(self, side_by_side: bool, failing: str | None = None, delay: float = 0.2) -> None:
        self._side_by_side, self.failing, self.delay = side_by_side, failing, delay
        self.opened: list[Session] = []
        self.threads: set[str] = set()
        self.lock = threading.Lock()

    def side_by_side(self) -> bool:
        return self._side_by_side

    def __call__(self, component: str) -> Session:
        with self.lock:
            self.threads.add(threading.current_thread().name)
        time.sleep(self.delay)
        if component == self.failing:
            raise ValueError(f"{component} is broken")
        session = Session(component)
        with self.lock:
            self.opened.append(session)
        return session


@pytest.mark.parametrize("side_by_side", [True, False])
def test_every_component_is_opened_once_and_returned_in_the_asked_order(side_by_side):
    loader = Loader(side_by_side)
    wanted = ["text_encoder", "unet", "vae_decoder"]
    sessions = open_components(loader, wanted)
    assert list(sessions) == wanted and [s.name for s in sessions.values()] == wanted
    assert len(loader.opened) == 3 and not any(s.closed for s in loader.opened)
    assert (len(loader.threads) > 1) == side_by_side  # in turn: all on the caller's thread


@pytest.mark.parametrize("side_by_side", [True, False])
def test_a_component_that_fails_closes_those_opened_and_raises_its_error(side_by_side):
    loader = Loader(side_by_side, failing="unet")
    with pytest.raises(ValueError, match="unet is broken"):
        open_components(loader, ["text_encoder", "unet", "vae_decoder"])
    assert loader.opened and all(s.closed for s in loader.opened)


def test_only_stored_artifacts_on_a_cpu_open_side_by_side(tmp_path):
    def loader(**asked) -> ComponentLoader:
        return ComponentLoader(Request("m", **asked), found=None, controlnet=False)  # type: ignore[arg-type]

    assert loader(device="cpu").side_by_side()
    assert loader(target="openvino:cpu").side_by_side()
    assert not loader(device="nvidia").side_by_side()
    assert not loader(device="auto").side_by_side()  # no device probe on the load's path only to decide this
    assert not loader(device="cpu", weights=tmp_path / "model.safetensors").side_by_side()
    with_files = loader(device="cpu")
    with_files.files = {"unet": tmp_path / "unet.safetensors"}
    assert not with_files.side_by_side()
