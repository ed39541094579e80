"""KV tests run the tiny model on one thread."""
import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    # 2 shared cores: torch's thread pool costs more than it gives on the tiny test model.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
