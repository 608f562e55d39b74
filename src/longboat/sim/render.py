"""Fast offscreen camera frames from a MuJoCo model: no shadows, reflections or multisampling (about 10× faster
on a software GL, the usual headless case)."""

from __future__ import annotations

import numpy as np

from longboat.sim.errors import RenderError
from longboat.sim.optional import import_simulator


class CameraRenderer:
    """Renders named cameras of ``model`` at ``size``×``size``; cameras in ``rotated`` are turned 180° (MJCF
    cameras rolled upside down)."""

    def __init__(self, model, size: int, rotated: frozenset[str] = frozenset()):
        mujoco = import_simulator("mujoco")
        self.rotated = rotated
        model.vis.quality.offsamples = 0
        offscreen = model.vis.global_.offwidth, model.vis.global_.offheight
        model.vis.global_.offwidth = max(offscreen[0], size)
        model.vis.global_.offheight = max(offscreen[1], size)
        try:
            self._renderer = _renderer(mujoco, model, size)
        except RenderError:  # every later context is made at the model's offscreen size
            model.vis.global_.offwidth, model.vis.global_.offheight = offscreen
            raise
        for flag in (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION):
            self._renderer.scene.flags[flag] = 0

    def render(self, data, camera: str) -> np.ndarray:
        """uint8 RGB [size, size, 3] of ``camera`` in the state ``data``."""
        self._renderer.update_scene(data, camera=camera)
        img = self._renderer.render()
        return np.ascontiguousarray(img[::-1, ::-1]) if camera in self.rotated else img

    def close(self) -> None:
        self._renderer.close()


def _renderer(mujoco, model, size: int):
    """``mujoco.Renderer(model, size, size)``, or :class:`RenderError` when the GL context cannot hold such frames.
    A Renderer whose ``__init__`` failed is closed here: left to its ``__del__``, it prints errors at exit."""
    renderer = mujoco.Renderer.__new__(mujoco.Renderer)
    try:
        renderer.__init__(model, size, size)
    except (mujoco.FatalError, MemoryError) as e:
        if not hasattr(renderer, "_mjr_context"):  # set only once the GL context exists; close() reads it
            renderer._mjr_context = None
        renderer.close()
        raise RenderError(f"cannot render {size}x{size} camera frames here ({e}); choose a smaller size") from None
    return renderer
