"""The lab's SGLang simulator: what `sglang.launch_server` and `sglang.bench_serving` do, without a GPU.

Nothing here computes a token: ranks are processes that hold fake GPU memory (through the fake NVML's
registration files), and token timing comes from the performance model in perf.py. See README.md.
"""
