"""Probe: does TMA multicast across a 2-CTA cluster speed up the asynchronous GEMM mainloop?

The renderer's mainloop (``backend/tilelang/render_ws.py``) loads both operand tiles per block.
Two blocks that share ``n_blk`` read the same W tile, so a (1, 2, 1) cluster can load it once and
multicast it (TileLang 0.1.15: ``T.tma_copy(..., cluster_mask=0b11)``, a cluster barrier for the
slot-free signal that both blocks' consumers arrive on). That halves W's L2-to-SM traffic (a third
of all operand traffic at 128 x 256 tiles), which matters only if L2 bandwidth limits the loop.

Measured on the H200 (run 48, Matmul 1024 x 4096 x 4096 bf16, CUDA-graph replay, two rounds):
no multicast 47.2 / 47.3 us, W multicast 46.5 / 47.4, X multicast 46.9 / 50.6, torch.matmul
45.1 / 52.1; every variant verified. Within the run-to-run spread, so the renderer does not emit
clusters. Run on the GPU machine (TileLang unpacked as ``gpu_run.sh`` does) with
``python3 benchmarks/probes/gemm_cluster_multicast.py``; ``--lower`` only lowers to CUDA here.
"""

from __future__ import annotations

import argparse
import statistics

import tilelang
import tilelang.language as T

M, D, N = 1024, 4096, 4096
PASS_CONFIGS = {"tl.enable_fast_math": True}
VARIANTS = [  # (operand multicast to the cluster partner, block_m, block_n, block_d, stages)
    ("none", 128, 256, 64, 3),
    ("W", 128, 256, 64, 3),
    ("X", 128, 256, 64, 3),
]


def build(share: str, block_m: int, block_n: int, block_d: int, stages: int, threads: int = 256):
    """The mainloop as render_ws emits it, with one operand multicast when ``share`` names it."""
    clustered = share != "none"
    launch: dict = {"threads": threads + 128}
    if share == "W":  # partners share n_blk: cluster along the grid's m axis (y)
        launch["cluster_dims"] = (1, 2, 1)
    elif share == "X":  # partners share m_blk: cluster along n (x)
        launch["cluster_dims"] = (2, 1, 1)
    last = D // block_d - 1
    warps = threads // 32

    @T.prim_func
    def gemm(X: T.Tensor((M, D), "bfloat16"), W: T.Tensor((D, N), "bfloat16"), Y: T.Tensor((M, N), "bfloat16")):
        with T.Kernel(N // block_n, M // block_m, **launch) as (n_blk, m_blk):
            X_s = T.alloc_shared((stages, block_m, block_d), "bfloat16")
            W_s = T.alloc_shared((stages, block_d, block_n), "bfloat16")
            acc = T.alloc_fragment((block_m, block_n), "float32")
            out = T.alloc_shared((block_m, block_n), "bfloat16")
            full = T.alloc_barrier([128] * stages)
            if clustered:  # a slot is free once every consumer warp of both blocks is done with it
                empty = T.alloc_cluster_barrier([2 * warps] * stages)
            else:
                empty = T.alloc_barrier([threads] * stages)
            tx = T.get_thread_binding()
            if tx >= threads:
                T.set_max_nreg(24, 0)
                for s in T.serial(D // block_d):
                    T.barrier_wait(empty[s % stages], 1 - (s // stages) % 2)
                    x_src = X[m_blk * block_m:(m_blk + 1) * block_m, s * block_d:(s + 1) * block_d]
                    w_src = W[s * block_d:(s + 1) * block_d, n_blk * block_n:(n_blk + 1) * block_n]
                    if share == "X":
                        T.tma_copy(x_src, X_s[s % stages, :, :], barrier=full[s % stages], cluster_mask=0b11)
                    else:
                        T.tma_copy(x_src, X_s[s % stages, :, :], barrier=full[s % stages])
                    if share == "W":
                        T.tma_copy(w_src, W_s[s % stages, :, :], barrier=full[s % stages], cluster_mask=0b11)
                    else:
                        T.tma_copy(w_src, W_s[s % stages, :, :], barrier=full[s % stages])
                    T.barrier_arrive(full[s % stages])
            else:
                T.set_max_nreg(240, 1)
                T.clear(acc)
                for s in T.serial(D // block_d):
                    T.barrier_wait(full[s % stages], (s // stages) % 2)
                    T.wgmma_gemm(X_s[s % stages, :, :], W_s[s % stages, :, :], acc, policy=T.GemmWarpPolicy.FullRow)
                    T.wait_wgmma(1)
                    if s > 0:
                        if clustered:
                            if tx % 32 == 0:
                                T.mbarrier_arrive(empty[(s - 1) % stages], 0)
                                T.mbarrier_arrive(empty[(s - 1) % stages], 1)
                        else:
                            T.barrier_arrive(empty[(s - 1) % stages])
                T.wait_wgmma(0)
                if clustered:
                    if tx % 32 == 0:
                        T.mbarrier_arrive(empty[last % stages], 0)
                        T.mbarrier_arrive(empty[last % stages], 1)
                else:
                    T.barrier_arrive(empty[last % stages])
                T.copy(acc, out)
                T.copy(out, Y[m_blk * block_m:(m_blk + 1) * block_m, n_blk * block_n:(n_blk + 1) * block_n])
            if clustered:  # neither block exits while its partner may still arrive on its barriers
                T.cluster_sync()

    return gemm


def graph_time_us(fn, calls: int = 20, rounds: int = 15) -> float:
    """Median per-call time of ``calls`` back-to-back calls replayed from one CUDA graph."""
    import torch

    for _ in range(10):
        fn()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lower", action="store_true", help="lower every variant to CUDA source only (no GPU)")
    args = ap.parse_args()
    if args.lower:
        import tvm
        from tvm.target import Target

        target = Target({"kind": "cuda", "arch": "sm_90a"})
        for v in VARIANTS:
            with target, tvm.transform.PassContext(config=PASS_CONFIGS):
                src = tilelang.lower(build(*v), target=target).kernel_source
            print(v, "lowered;", "multicast" if "tma_load_multicast" in src else "unicast")
        return
    import torch

    torch.manual_seed(0)
    X = torch.randn(M, D, device="cuda", dtype=torch.bfloat16)
    W = torch.randn(D, N, device="cuda", dtype=torch.bfloat16)
    ref = X.double() @ W.double()
    Y = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    kernels = {v: tilelang.compile(build(*v), target="cuda", pass_configs=PASS_CONFIGS) for v in VARIANTS}
    rows = []
    for rnd in (1, 2):  # two rounds: the spread between them is the noise floor
        rows.append((f"torch.matmul r{rnd}", graph_time_us(lambda: torch.matmul(X, W, out=Y)), 0.0))
        for v, k in kernels.items():
            Y.fill_(float("nan"))
            k(X, W, Y)
            err = ((Y.double() - ref).abs().max() / ref.abs().max()).item()
            rows.append((f"{v} r{rnd}", graph_time_us(lambda k=k: k(X, W, Y)), err))
    print("| variant | us | normalised max error |\n|---|---|---|")
    for name, us, err in rows:
        print(f"| {name} | {us:.1f} | {err:.1e} |")


if __name__ == "__main__":
    main()
