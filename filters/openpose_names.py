"""Easy Diffusion's openpose names (`openpose_face`, `openpose_faceonly`, `openpose_full`) as the filters they need
and what is drawn, as controlnet-aux's include_body / include_hand / include_face flags: the face filter (which runs
its body filter) always, the hand filter for full.

    control = enginefarm.filters.control_from(photo, "openpose_full", store=STORE)
    with enginefarm.filters.load("openpose-face", store=STORE) as face:
        control = face_control(face, photo, body=False)   # openpose_faceonly
"""

from __future__ import annotations

import numpy as np

from .openpose import pose_control

# Easy Diffusion's openpose names → (draw the bodies, run the hand filter too): the face filter always runs
POSE_NAMES = {"openpose_face": (True, False), "openpose_faceonly": (False, False), "openpose_full": (True, True)}
FACE_FILTER = "openpose-face"  # the catalog's names, what control_from loads for Easy Diffusion's names
HAND_FILTER = "openpose-hand"


def face_control(face, image: np.ndarray, detect_resolution: int | None = None, *, body: bool = True, hand=None):
    """The control image float32 [H, W, 3] in [0, 1] of a photo: each person's face (the face filter `face`, its
    body filter finding the people), over their body unless `body` is False, with their hands where `hand` (a
    loaded openpose_hand filter) is given: controlnet-aux's include_body / include_hand / include_face."""
    return pose_control(face.uses["body"], image, detect_resolution, hand=hand, face=face, body=body)


def named_pose_control(image: np.ndarray, name: str, detect_resolution: int | None = None, **options) -> np.ndarray:
    """Easy Diffusion's `openpose_face`, `openpose_faceonly` or `openpose_full` control image of a photo, from the
    store's filters `openpose-face` (and `openpose-hand` for full; each loads its body filter): `options` are
    `enginefarm.filters.load`'s. A filter the store lacks is one line naming it."""
    from enginefarm.errors import ArtifactNotFoundError, ConfigError

    from .loading import load

    body, with_hand = POSE_NAMES[name]
    needed = [FACE_FILTER, HAND_FILTER] if with_hand else [FACE_FILTER]
    try:
        with load(FACE_FILTER, **options) as face:
            if face.task != "openpose_face":
                raise ConfigError(
                    f"--control-from {name}: {FACE_FILTER} is a {face.task} filter, not openpose_face",
                    hint="build recipes/catalog/openpose-face.toml (facenet.pth) as openpose-face",
                )
            if not with_hand:
                return face_control(face, image, detect_resolution, body=body)
            with load(HAND_FILTER, **options) as hand:
                return face_control(face, image, detect_resolution, body=body, hand=hand)
    except ArtifactNotFoundError as exc:
        raise ConfigError(
            f"--control-from {name} runs the filters {', '.join(needed)} and their body filter: {exc.message}",
            hint="build openpose-body.toml, openpose-face.toml"
            + (" and openpose-hand.toml" if with_hand else "")
            + " from recipes/catalog into the store",
        ) from None
