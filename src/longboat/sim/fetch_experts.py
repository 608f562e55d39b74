"""Scripted experts for the Fetch tasks: proportional control of the gripper toward a phase's target.

Fetch's observation: gripper position [0:3], object position [3:6], finger opening [9:11]; an action moves the
gripper by up to 5 cm per axis and opens (+1) or closes (-1) the fingers.
"""

from __future__ import annotations

import numpy as np

GAIN = 10.0  # action per metre of error: full speed beyond 10 cm


def _move(grip: np.ndarray, target: np.ndarray, fingers: float) -> np.ndarray:
    return np.append(np.clip(GAIN * (target - grip), -1, 1), fingers).astype(np.float32)


def reach(obs: np.ndarray, goal: np.ndarray) -> np.ndarray:
    return _move(obs[0:3], goal, 0.0)


def push(obs: np.ndarray, goal: np.ndarray) -> np.ndarray:
    """Rise, come down behind the block (seen from the goal), then push it at 80% speed through to the goal."""
    grip, block = obs[0:3], obs[3:6]
    heading = goal[:2] - block[:2]
    heading /= max(np.linalg.norm(heading), 1e-6)
    behind = np.append(block[:2] - 0.06 * heading, block[2])
    along = np.dot(block[:2] - grip[:2], heading)  # how far the block is ahead of the gripper
    lateral = np.linalg.norm(block[:2] - grip[:2] - along * heading)
    if 0.02 < along < 0.08 and lateral < 0.02 and grip[2] < block[2] + 0.02:  # lined up: push
        target = np.append(goal[:2] - 0.05 * heading, block[2])
        return np.append(np.clip(_move(grip, target, -1.0)[:3], -0.8, 0.8), -1.0).astype(np.float32)
    if np.linalg.norm(grip[:2] - behind[:2]) > 0.015:
        if grip[2] < block[2] + 0.04:  # clear the block before travelling
            return _move(grip, np.append(grip[:2], block[2] + 0.06), -1.0)
        return _move(grip, behind + [0, 0, 0.06], -1.0)
    return _move(grip, behind, -1.0)


def pick_and_place(obs: np.ndarray, goal: np.ndarray) -> np.ndarray:
    """Open above the block, descend, close, then carry it to the goal."""
    grip, block, opening = obs[0:3], obs[3:6], obs[9] + obs[10]
    near = np.linalg.norm(grip[:2] - block[:2]) < 0.01
    held = np.linalg.norm(grip - block) < 0.02 and opening < 0.06
    if held:
        return _move(grip, goal, -1.0)
    if near and abs(grip[2] - block[2]) < 0.01:
        return _move(grip, block, -1.0)  # grasp
    if near:
        return _move(grip, block, 1.0)  # descend with fingers open
    return _move(grip, block + [0, 0, 0.05], 1.0)


EXPERTS = {"reach": reach, "push": push, "pick_and_place": pick_and_place}
