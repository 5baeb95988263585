import torch

from sarcompile.runtime.memory import MemoryProbe


def test_probe_sees_a_large_temporary_and_resets_between_uses():
    probe = MemoryProbe(device="cpu")
    with probe:
        big = torch.ones(16 << 20)  # 64 MiB, touched
        del big
    assert probe.added_bytes >= 60 << 20
    with probe:  # the peak was reset: a small step shows a small peak
        torch.ones(1 << 10)
    assert probe.added_bytes < 32 << 20
