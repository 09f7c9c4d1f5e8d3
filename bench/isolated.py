"""Isolated timing for the Python peer scripts, as the Rust benchmark times: a memset of twice
the L2 before each sample, a GPU spin while the host enqueues, one call between two CUDA
events, the median of the samples."""

import torch

SAMPLES = 25


def l2_flush():
    """A buffer of twice the L2's size, for `isolated` to write before each sample."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return torch.empty(2 * l2 // 4, dtype=torch.int32, device="cuda")


def isolated(call, flush):
    """The median of SAMPLES isolated timings of `call`, in microseconds (after one untimed
    call)."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    call()
    torch.cuda.synchronize()
    samples = []
    for _ in range(SAMPLES):
        flush.zero_()
        torch.cuda._sleep(400_000)
        start.record()
        call()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) * 1e3)
    samples.sort()
    return samples[SAMPLES // 2]
