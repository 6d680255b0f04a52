"""CUDA-event medians of several callables timed call by call in turn (so that clocks, power
and the other tenants of the card weigh on each alike), for the tools that compare FlashCore
with PyTorch on the same inputs. Each runs twice untimed first."""
import torch


def medians(fns, iters):
    """Median microseconds of each callable in `fns` over `iters` interleaved rounds."""
    for fn in fns:
        fn(); fn()
    torch.cuda.synchronize()
    times = [[] for _ in fns]
    for _ in range(iters):
        for t, fn in zip(times, fns):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); fn(); b.record(); b.synchronize()
            t.append(a.elapsed_time(b) * 1e3)
    return [sorted(t)[len(t) // 2] for t in times]
