"""Clocks and power while one attention call runs back to back: does a long kernel run at the
clock a short one gets? For each implementation in turn (FlashCore's forward or forward +
backward, PyTorch's SDPA with one backend), the call runs for --seconds while nvidia-smi samples
the SM clock, power draw, temperature and the active clock-throttle reasons every 50 ms; then the
median clock and power, the calls' CUDA-event times (the first three and the median), TFLOP/s.
Implementations alternate over --rounds, so the card's warmth weighs on each alike.

    python tools/clocks_under_load.py --shape 1,32,8,32768,65536 [--causal] [--bwd]
      shape: B, Hq, Hkv, Sq, Sk (D from --dim, 128); bf16; GQA when Hq != Hkv
"""
import argparse, json, statistics, subprocess, time
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import flashcore

FIELDS = "clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active"


def fields(device_index):
    """FIELDS, less the throttle reasons where this driver names them otherwise."""
    once = subprocess.run(["nvidia-smi", f"--query-gpu={FIELDS}", "--format=csv,noheader",
                           "-i", str(device_index)], capture_output=True, text=True)
    return FIELDS if once.returncode == 0 else FIELDS.rsplit(",", 1)[0]


def sampler(device_index):
    return subprocess.Popen(["nvidia-smi", f"--query-gpu={fields(device_index)}", "--format=csv,noheader,nounits",
                             "-lms", "50", "-i", str(device_index)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def samples_of(proc):
    proc.terminate()
    out, _ = proc.communicate(timeout=10)
    rows = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            rows.append((float(parts[0]), float(parts[1]), float(parts[2]),
                         parts[3] if len(parts) > 3 else "?"))
        except (ValueError, IndexError):
            continue
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shape", default="1,32,8,32768,65536")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--bwd", action="store_true", help="forward + backward (default: forward)")
    ap.add_argument("--impls", default="flashcore,cudnn")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    B, Hq, Hkv, Sq, Sk = (int(x) for x in args.shape.split(","))
    D, dt = args.dim, torch.bfloat16
    q = torch.randn(B, Hq, Sq, D, device="cuda", dtype=dt, requires_grad=args.bwd)
    k, v = (torch.randn(B, Hkv, Sk, D, device="cuda", dtype=dt, requires_grad=args.bwd) for _ in range(2))
    g = torch.randn(B, Hq, Sq, D, device="cuda", dtype=dt)
    gqa = Hq != Hkv
    n = min(Sq, Sk)  # top-left causal: row i sees min(i + 1, Sk) keys
    pairs = Sq * Sk if not args.causal else n * (n + 1) // 2 + (Sq - n) * Sk
    flops = 4 * B * Hq * pairs * D * (3.5 if args.bwd else 1.0)

    def call(impl):
        def attend():
            if impl == "flashcore":
                return flashcore.sdpa(q, k, v, is_causal=args.causal, enable_gqa=gqa)
            backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                       "efficient": SDPBackend.EFFICIENT_ATTENTION}[impl]
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=args.causal, enable_gqa=gqa)
        if not args.bwd:
            def fwd():
                with torch.no_grad():
                    attend()
            return fwd
        return lambda: torch.autograd.grad(attend(), (q, k, v), g)

    dev = torch.cuda.current_device()
    name = torch.cuda.get_device_name()
    print(f"{name}  shape B={B} Hq={Hq} Hkv={Hkv} Sq={Sq} Sk={Sk} D={D} causal={args.causal} "
          f"{'fwd+bwd' if args.bwd else 'fwd'}  {args.seconds:g} s per run")
    print(f"{'impl':10s} {'round':>5s} {'calls':>5s} {'first ms':>20s} {'median ms':>9s} {'TFLOP/s':>8s} "
          f"{'MHz med':>7s} {'MHz min':>7s} {'W med':>6s} {'C max':>5s}  throttle reasons seen")
    rows = []
    for r in range(args.rounds):
        for impl in args.impls.split(","):
            fn = call(impl)
            fn(); torch.cuda.synchronize()
            time.sleep(1.0)  # (the same idle gap before each run)
            proc = sampler(dev)
            time.sleep(0.2)
            times, t_end = [], time.perf_counter() + args.seconds
            while time.perf_counter() < t_end:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(); fn(); b.record(); b.synchronize()
                times.append(a.elapsed_time(b))
            smp = samples_of(proc)
            busy = [s for s in smp if s[1] > 150.0] or smp  # the samples under load
            reasons = sorted({s[3] for s in busy})
            row = dict(impl=impl, round=r, calls=len(times), first_ms=times[:3],
                       median_ms=statistics.median(times), tflops=flops / statistics.median(times) / 1e9,
                       mhz_median=statistics.median(s[0] for s in busy) if busy else None,
                       mhz_min=min(s[0] for s in busy) if busy else None,
                       watts_median=statistics.median(s[1] for s in busy) if busy else None,
                       temp_max=max(s[2] for s in busy) if busy else None, throttle=reasons)
            rows.append(row)
            first = "/".join(f"{t:.1f}" for t in times[:3])
            print(f"{impl:10s} {r:5d} {len(times):5d} {first:>20s} {row['median_ms']:9.2f} {row['tflops']:8.0f} "
                  f"{row['mhz_median'] or 0:7.0f} {row['mhz_min'] or 0:7.0f} {row['watts_median'] or 0:6.0f} "
                  f"{row['temp_max'] or 0:5.0f}  {' '.join(reasons)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(card=name, torch=torch.__version__, args=vars(args), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
