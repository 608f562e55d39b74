"""The vision backbones run at the tiny policies' sizes: one thread, as in ``tests/models/policy/conftest.py``."""

import pytest


@pytest.fixture(autouse=True)
def _backbones_on_one_thread(one_thread):
    """Tiny backbones step fastest on one thread, which also keeps any stated numbers reproducible."""
    yield
