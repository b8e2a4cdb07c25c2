"""SGLang's checks that fire inside the scheduler processes, as pure functions.

The launcher evaluates them once (so that every rank sees the same snapshot of GPU memory, as SGLang's
all-reduced numbers do) and hands each rank what it must do: load, or fail at a given point with SGLang's
exception and message.
"""
GIB = 1 << 30
MIB = 1 << 20
CUDA_CONTEXT_BYTES = 512 * MIB  # CUDA context + NCCL buffers of one rank


def pp_layer_split(num_layers, pp_size, partition=None):
    """[(start, end)] per PP stage (sglang.srt.distributed.utils.get_pp_indices), ValueError as SGLang raises it.

    partition is the value of SGLANG_PP_LAYER_PARTITION ("39,39") or None for SGLang's default split: base
    num_layers // pp, and the last num_layers % pp stages get one more layer.
    """
    if partition is not None:
        try:
            partitions = [int(layer) for layer in partition.split(",")]
        except ValueError:
            raise ValueError("Invalid partition string: {}".format(partition)) from None
        if len(partitions) != pp_size:
            raise ValueError(f"{len(partitions)=} does not match {pp_size=}.")
        if sum(partitions) != num_layers:
            raise ValueError(f"{sum(partitions)=} does not match {num_layers=}.")
    else:
        base, remainder = divmod(num_layers, pp_size)
        partitions = [base + (1 if rank >= pp_size - remainder else 0) for rank in range(pp_size)]
    out, start = [], 0
    for count in partitions:
        out.append((start, start + count))
        start += count
    return out


def construction_error(model, tp_size, pp_size, attn_tp_size, partition):
    """(exception name, message) that building the model raises on every rank, or None.

    Order as in SGLang's model code: make_layers asserts layers >= pp and splits the layers, the MoE block
    refuses tp > routed experts, attention asserts heads % tp == 0 (and KV heads for GQA).
    """
    if pp_size and model.layers < pp_size:
        return "AssertionError", "assert not pp_size or num_hidden_layers >= pp_size"
    try:
        pp_layer_split(model.layers, pp_size, partition)
    except ValueError as err:
        return "ValueError", str(err)
    if model.experts and tp_size > model.experts:
        return "ValueError", "Tensor parallel size {} is greater than the number of experts {}.".format(
            tp_size, model.experts)
    if model.heads % attn_tp_size:
        return "AssertionError", "assert num_heads % attn_tp_size == 0"
    if not model.is_mla:
        if model.kv_heads >= attn_tp_size and model.kv_heads % attn_tp_size:
            return "AssertionError", "assert self.total_num_kv_heads % tp_size == 0"
        if model.kv_heads < attn_tp_size and attn_tp_size % model.kv_heads:
            return "AssertionError", "assert tp_size % self.total_num_kv_heads == 0"
    return None


def kv_dtype_bytes(kv_cache_dtype):
    if kv_cache_dtype in ("fp8_e5m2", "fp8_e4m3", "mxfp8"):
        return 1
    if kv_cache_dtype in ("fp4_e2m1", "nvfp4", "fp4_mx_block16"):
        return 0.5
    return 2


def kv_dtype_name(kv_cache_dtype):
    """The torch dtype 0.5.23's `KV Cache is allocated. dtype: ...` line names (the FP4 kinds are stored packed)."""
    return {"fp8_e5m2": "torch.float8_e5m2", "fp8_e4m3": "torch.float8_e4m3fn", "mxfp8": "torch.float8_e4m3fn",
            "fp4_e2m1": "torch.uint8", "nvfp4": "torch.uint8", "fp4_mx_block16": "torch.uint8"}.get(
                kv_cache_dtype, "torch.bfloat16")


def oom_message(ordinal, total, free, in_use, request):
    return (
        "CUDA out of memory. Tried to allocate {:.2f} GiB. GPU {} has a total capacity of {:.2f} GiB of which "
        "{:.2f} MiB is free. Including non-PyTorch memory, this process has {:.2f} GiB memory in use. Of the "
        "allocated memory {:.2f} GiB is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. "
        "If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
        "to avoid fragmentation.  See documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)".format(
            request / GIB, ordinal, total / GIB, max(free, 0) / MIB, in_use / GIB,
            max(in_use - CUDA_CONTEXT_BYTES, 0) / GIB)
    )


def unbalanced_message(min_per_gpu, local):
    """model_runner.init_torch_distributed's text (bytes in, GB out) when the world's minimum free memory is
    below 90% of this GPU's."""
    return ("The memory capacity is unbalanced. Some GPUs may be occupied by other processes. "
            "min_per_gpu_memory={}, local_gpu_memory={}, local_gpu_memory * 0.9={}".format(
                min_per_gpu / GIB, local / GIB, local / GIB * 0.9))


def memory_plan(total, reserved, others, weights, mem_fraction_static, world_avail, tp_size, cell_bytes,
                max_total_tokens=None):
    """What happens to one rank's memory, SGLang 0.5.9's way (model_runner and its KV cache mixin).

    total/reserved/others: bytes of the GPU, held with no process, held by other processes. world_avail: free
    bytes on every GPU of the instance before loading. Returns a dict with `error` (None, or
    (stage, exception, message)) and the numbers the logs show.
    """
    avail = total - reserved - others
    plan = {"avail_before": avail, "weights": weights, "context": CUDA_CONTEXT_BYTES, "error": None,
            "kv_bytes": 0, "max_total_num_tokens": 0}
    if tp_size > 1 and min(world_avail) < avail * 0.9:
        plan["error"] = ("init", "RuntimeError", unbalanced_message(min(world_avail), avail))
        return plan
    after_weights = avail - CUDA_CONTEXT_BYTES - weights
    plan["avail_after_weights"] = after_weights
    if after_weights < 0:
        loaded = max(avail - CUDA_CONTEXT_BYTES, 0)
        plan["oom_after_bytes"] = loaded
        plan["error"] = ("load", "OutOfMemoryError", None)
        return plan
    rest = after_weights - total * (1 - mem_fraction_static)
    tokens = int(rest) // cell_bytes if rest > 0 else 0
    if max_total_tokens:
        tokens = min(tokens, int(max_total_tokens))
    if tokens <= 0:
        plan["error"] = ("kv", "RuntimeError",
                         "Not enough memory. Please try to increase --mem-fraction-static. "
                         f"Current value: self.server_args.mem_fraction_static={mem_fraction_static}")
        return plan
    plan["max_total_num_tokens"] = tokens
    plan["kv_bytes"] = tokens * cell_bytes
    return plan


def max_running_requests(max_total_num_tokens, context_len, requested, dp_size=1):
    """ModelRunner.max_running_requests in 0.5.9; dp_size is ModelRunner.dp_size, the attention-DP size (1 without
    DP attention: 59:sglang/srt/model_executor/model_runner.py `self.dp_size = server_args.dp_size if
    server_args.enable_dp_attention else 1`)."""
    if requested is not None:
        return min(requested // dp_size, max(max_total_num_tokens, 1))
    pool = min(max(int(max_total_num_tokens / context_len * 512), 2048), 4096)
    return max(min(max_total_num_tokens // 2, pool), 1)


def graph_bytes(phase, sizes, mla=False):
    """Memory one CUDA graph's capture takes from the slack left by mem_fraction_static: the decode graph 256 MiB +
    2 MiB per batch size up to the largest; 0.5.23's prefill graph what SGLang reserves for it (MLA 1.5 GiB, else
    8 MiB per captured size, 523:sglang/srt/arg_groups/memory_hook.py:383-390)."""
    if phase == "prefill":
        return int(1.5 * 1024 * MIB if mla else len(sizes) * 8 * MIB)
    return int(256 * MIB + max(sizes or [0]) * 2 * MIB)
