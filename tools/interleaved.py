"""CUDA-event medians of several callables timed call by call in turn (so that clocks, power
and the other tenants of the card weigh on each alike), for the tools that compare FlashCore
with PyTorch on the same inputs. Each runs twice untimed first.

Timed one call at a time (queue=1), a call's host time shows wherever it exceeds its GPU time:
the GPU waits for each launch. Inside a model the host runs ahead of the GPU and hides it, so
`queue` > 1 times that many calls issued back to back per sample and reports the time per call
(as a model's layers see it while the host keeps ahead)."""
import torch


def medians(fns, iters, queue=1):
    """Median microseconds per call of each callable in `fns` over `iters` interleaved rounds,
    each sample `queue` calls issued back to back."""
    if queue < 1:
        raise ValueError(f"queue must be at least 1 (got {queue})")
    for fn in fns:
        fn(); fn()
    torch.cuda.synchronize()
    times = [[] for _ in fns]
    for _ in range(iters):
        for t, fn in zip(times, fns):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(queue):
                fn()
            b.record(); b.synchronize()
            t.append(a.elapsed_time(b) * 1e3 / queue)
    return [sorted(t)[len(t) // 2] for t in times]
