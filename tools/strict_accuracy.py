"""Inference outputs in float32 against float64, ours beside cuDNN strict's, and cuDNN's
kernels for the call.

    python tools/strict_accuracy.py [ids]

For each shape id of bench.paths' table: torch.nn.GRU's weights (torch's init, seed 0), x and
h0 drawn in float32; y from cuDNN in float32 with TF32 off (torch.backends.cudnn.allow_tf32 =
False), from cugru.gru_forward (float32, math="strict", path="auto") and from cuDNN in float64
on the same values, the reference. Prints each float32 y's largest and root mean square
error, and the kernels cuDNN's float32 call runs (torch.profiler), by total time. GPU and
torch needed.
"""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ids", nargs="*", default=["O11"])
    args = ap.parse_args(argv)
    import cupy as cp
    import torch
    from torch.profiler import ProfilerActivity, profile

    import cugru
    from bench.paths import ALL
    torch.backends.cudnn.allow_tf32 = False
    print("| id | T, B, I, H, bi | cuDNN float32: max, rms error | ours: max, rms error |")
    print("|---|---|---|---|")
    kernels = {}
    for sid in args.ids:
        T, B, I, H, bi = ALL[sid][0]
        D = 2 if bi else 1
        torch.manual_seed(0)
        m32 = torch.nn.GRU(I, H, bidirectional=bi).cuda()
        m64 = torch.nn.GRU(I, H, bidirectional=bi).cuda().double()
        m64.load_state_dict({k: v.double() for k, v in m32.state_dict().items()})
        x = torch.randn(T, B, I, device="cuda")
        h0 = torch.randn(D, B, H, device="cuda")
        names = [f"{w}_l0{s}" for s in ([""] + ["_reverse"] * bi)
                 for w in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
        with torch.no_grad():
            y32, _ = m32(x, h0)
            ref, _ = m64(x.double(), h0.double())
            w = [torch.stack([getattr(m32, n) for n in names[k::4]]).contiguous()
                 for k in range(4)]
            y, _, _ = cugru.gru_forward(cp.from_dlpack(x), cp.from_dlpack(h0),
                                        *map(cp.from_dlpack, w), bidirectional=bi,
                                        training=False)
            ours = torch.from_dlpack(y)
            row = [sid, ", ".join(map(str, ALL[sid][0]))]
            for got in (y32, ours):
                err = (got.double() - ref).abs()
                row.append(f"{err.max().item():.1e}, {err.pow(2).mean().sqrt().item():.1e}")
            print("| " + " | ".join(row) + " |", flush=True)
            for _ in range(3):
                m32(x, h0)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                m32(x, h0)
                torch.cuda.synchronize()
        kernels[sid] = sorted(((e.name, e.time_range.end - e.time_range.start)
                               for e in prof.events() if e.device_type.name == "CUDA"),
                              key=lambda k: -k[1])
    for sid, ks in kernels.items():
        print(f"\n{sid}: cuDNN's float32 call, µs: "
              + "; ".join(f"`{name[:70]}` {t:.1f}" for name, t in ks[:4]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
