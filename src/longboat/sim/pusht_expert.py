"""A scripted expert for gym-pusht: random-shooting model-predictive control on a copy of the 2-D physics.

Every ``2 * hold`` steps it samples ``candidates`` plans of two waypoints for the pusher (the first around the
block, the second a short push on from it), simulates each in a fresh pymunk space set to the present state, and
keeps the plan that leaves the T's corners nearest the goal's. The pusher is driven as the environment drives it
(PD control towards the waypoint), so a plan's simulated outcome is what the environment does.
"""

from __future__ import annotations

import numpy as np

ARENA = (20.0, 490.0)  # waypoints stay clear of the walls


class PushTExpert:
    def __init__(self, candidates: int = 48, hold: int = 4, reach: float = 120.0, push: float = 60.0):
        self.candidates, self.hold, self.reach, self.push = candidates, hold, reach, push
        self._plan: list[np.ndarray] = []
        self._rng = np.random.default_rng(0)

    def reset(self, seed: int) -> None:
        self._plan, self._rng = [], np.random.default_rng(seed)

    def action(self, env) -> np.ndarray:
        """The next pusher target (x, y) for the unwrapped ``PushTEnv`` ``env``."""
        if not self._plan:
            self._plan = [w for w in self._best_plan(env) for _ in range(self.hold)]
        return self._plan.pop(0).astype(np.float32)

    def _best_plan(self, env) -> list[np.ndarray]:
        goal = _corners(env, env.get_goal_pose_body(env.goal_pose))
        block = np.asarray(env.block.position)
        best, best_cost = None, np.inf
        for _ in range(self.candidates):
            first = block + self._rng.uniform(-self.reach, self.reach, 2)
            plan = [np.clip(first, *ARENA), np.clip(first + self._rng.uniform(-self.push, self.push, 2), *ARENA)]
            cost = np.linalg.norm(_corners(env, self._simulate(env, plan)) - goal, axis=1).mean()
            if cost < best_cost:
                best, best_cost = plan, cost
        return best

    def _simulate(self, env, plan: list[np.ndarray]):
        """The block's body after following ``plan`` from the present state in a copy of the physics."""
        import pymunk

        space = pymunk.Space()
        space.gravity, space.damping = (0, 0), env.space.damping
        space.add(*[pymunk.Segment(space.static_body, s.a, s.b, s.radius) for s in env.space.static_body.shapes])
        pusher = env.add_circle(space, tuple(env.agent.position), next(iter(env.agent.shapes)).radius)
        pusher.velocity = env.agent.velocity
        block, _ = env.add_tee(space, tuple(env.block.position), env.block.angle)
        block.velocity, block.angular_velocity = env.block.velocity, env.block.angular_velocity
        substeps = int(1 / (env.dt * env.control_hz))
        for target in plan:
            target = pymunk.Vec2d(*target)
            for _ in range(self.hold * substeps):
                pusher.velocity += (env.k_p * (target - pusher.position) - env.k_v * pusher.velocity) * env.dt
                space.step(env.dt)
        return block


def _corners(env, body) -> np.ndarray:
    """The T's 8 corners placed at ``body``'s pose, [8, 2]."""
    return np.array([body.local_to_world(v) for shape in env.block.shapes for v in shape.get_vertices()])
