"""PyTorch workloads for the GPU check's priority figure.

serve COUNT: an inference loop at 50 % duty: COUNT forward passes of a small MLP, each
waited for, then as long idle; prints the latency's median and 99th percentile.
train SECONDS: a training loop that keeps the GPU busy; prints its steps per second.
"""
import sys
import time

import torch


def serve(count):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)]).cuda().half()
    batch = torch.randn(256, 4096, device="cuda", dtype=torch.half)
    with torch.no_grad():
        for _ in range(20):  # warm up: kernels loaded, and priced by the hook
            model(batch)
        torch.cuda.synchronize()
        latencies = []
        for _ in range(count):
            start = time.perf_counter()
            model(batch)
            torch.cuda.synchronize()
            latency = time.perf_counter() - start
            latencies.append(latency)
            time.sleep(latency)
    latencies.sort()
    print(f"p50_ms={1000 * latencies[len(latencies) // 2]:.3f}")
    print(f"p99_ms={1000 * latencies[len(latencies) * 99 // 100]:.3f}")


def train(seconds):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(8192, 8192) for _ in range(4)]).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    batch = torch.randn(2048, 8192, device="cuda")
    steps, end = 0, time.perf_counter() + seconds
    print("started", flush=True)
    while time.perf_counter() < end:
        optimizer.zero_grad()
        model(batch).square().mean().backward()
        optimizer.step()
        steps += 1
        if steps % 4 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    print(f"steps_per_s={steps / seconds:.1f}")


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
    else:
        train(float(sys.argv[2]))
