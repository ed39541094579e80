"""KV tests run the tiny model on one thread."""

import pytest


@pytest.fixture(autouse=True)
def _tests_here_use_one_thread(one_thread):
    yield
