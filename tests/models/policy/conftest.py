import pytest


@pytest.fixture(autouse=True)
def _policies_on_one_thread(one_thread):
    """Tiny policies step fastest on one thread, which also keeps the overfit tests' stated numbers reproducible."""
    yield
