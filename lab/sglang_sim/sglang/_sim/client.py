"""Benchmark the online serving throughput: the lab's stand-in for SGLang's own client, `python -m
sglang.bench_serving` (0.5.9) and `python -m sglang.benchmark.serving` (0.5.23; `sglang.bench_serving` still works
there with a FutureWarning), following the release in sglang.version.

Same flags (those the project uses; the rest are accepted and ignored where harmless), same console summary,
same JSON line appended to --output-file, same exit codes: 0 when the run completes even if some requests
failed (completed < num_prompts), 1 when the warmup fails or the server cannot be reached. Requests really go
to the server (/generate streaming, bounded by --max-concurrency, paced by --request-rate) and TTFT, ITL and
end-to-end latency are measured from the stream. Stdlib only: no tokenizer, no numpy, no aiohttp. Prompts of
the random-ids dataset are random token ids written as words; the simulated server counts one token per word.
Datasets that SGLang downloads (sharegpt, random, ...) are refused: the lab has no network.
"""
import argparse
import asyncio
import json
import math
import os
import random
import resource
import statistics
import sys
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request
import warnings
from dataclasses import dataclass, field
from datetime import datetime
from typing import List, Optional

from sglang._sim import release

DOWNLOADING_DATASETS = ("sharegpt", "random", "generated-shared-prefix", "mmmu", "image", "mooncake")
BACKENDS = ("sglang", "sglang-native", "sglang-oai", "sglang-oai-chat", "vllm", "vllm-chat", "lmdeploy",
            "lmdeploy-chat", "trt", "gserver", "truss")
VOCAB_SIZE = 32000


@dataclass
class DatasetRow:
    prompt: object
    prompt_len: int
    output_len: int


@dataclass
class RequestFuncOutput:
    generated_text: str = ""
    success: bool = False
    latency: float = 0.0
    ttft: float = 0.0
    itl: List[float] = field(default_factory=list)
    prompt_len: int = 0
    error: str = ""
    output_len: int = 0
    start_time: float = 0.0


def get_auth_headers():
    openai_api_key = os.environ.get("OPENAI_API_KEY")
    if openai_api_key:
        return {"Authorization": "Bearer %s" % openai_api_key}
    api_key = os.environ.get("API_KEY")
    if api_key:
        return {"Authorization": api_key}
    return {}


# ---------------------------------------------------------------------------------------------- statistics
def percentile(values, q):
    """numpy.percentile with linear interpolation (numpy's default)."""
    data = sorted(values)
    if not data:
        return 0.0
    k = (len(data) - 1) * q / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (k - lo)


def mean(values):
    return statistics.fmean(values) if values else float("nan")


def median(values):
    return statistics.median(values) if values else float("nan")


def std(values):
    return statistics.pstdev(values) if values else float("nan")


def or_zero(values):
    """bench_serving computes `np.mean(ttfts or 0)`: an empty list counts as [0]."""
    return values or [0.0]


# ---------------------------------------------------------------------------------------------- dataset
def compute_random_lens(rng, full_len, range_ratio, num):
    low = max(int(full_len * range_ratio), 1)
    return [rng.randint(low, full_len) for _ in range(num)]


def sample_random_ids(args, rng):
    input_lens = compute_random_lens(rng, args.random_input_len, args.random_range_ratio, args.num_prompts)
    output_lens = compute_random_lens(rng, args.random_output_len, args.random_range_ratio, args.num_prompts)
    rows = []
    for i in range(args.num_prompts):
        offset = rng.randrange(VOCAB_SIZE)
        ids = [(offset + i + j) % VOCAB_SIZE for j in range(input_lens[i])]
        prompt = ids if args.tokenize_prompt else " ".join("t%d" % t for t in ids)
        rows.append(DatasetRow(prompt=prompt, prompt_len=input_lens[i], output_len=output_lens[i]))
    print("#Input tokens: %d" % sum(input_lens))
    print("#Output tokens: %d" % sum(output_lens))
    return rows


# ---------------------------------------------------------------------------------------------- HTTP
async def _open(url):
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http":
        raise ValueError("the lab client speaks plain http only, got %s" % url)
    host = parts.hostname
    port = parts.port or 80
    reader, writer = await asyncio.open_connection(host, port, limit=16 * 1024 * 1024)
    return reader, writer, parts


async def _chunks(reader, headers):
    """Body of a response: chunked transfer encoding, Content-Length or until close."""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size_line = await reader.readline()
            if not size_line:
                raise ConnectionResetError("connection closed inside a chunked response")
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                await reader.readline()
                return
            data = await reader.readexactly(size)
            await reader.readexactly(2)
            yield data
    elif "content-length" in headers:
        length = int(headers["content-length"])
        if length:
            yield await reader.readexactly(length)
    else:
        while True:
            data = await reader.read(65536)
            if not data:
                return
            yield data


async def _post(url, payload, headers):
    reader, writer, parts = await _open(url)
    body = json.dumps(payload).encode()
    target = parts.path or "/"
    head = ["POST %s HTTP/1.1" % target, "Host: %s" % parts.netloc, "Content-Type: application/json",
            "Content-Length: %d" % len(body), "Connection: close"]
    head += ["%s: %s" % kv for kv in headers.items()]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
    await writer.drain()
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionResetError("server closed the connection without answering")
    _, status, reason = (status_line.decode("latin-1").rstrip("\r\n").split(" ", 2) + [""])[:3]
    response_headers = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        key, _, value = line.decode("latin-1").partition(":")
        response_headers[key.strip().lower()] = value.strip()
    return int(status), reason, response_headers, reader, writer


async def async_request_sglang_generate(args, api_url, row, output_len, pbar=None):
    payload = {
        ("text" if isinstance(row.prompt, str) else "input_ids"): row.prompt,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": output_len, "ignore_eos": not args.disable_ignore_eos},
        "stream": not args.disable_stream,
        "lora_path": None,
        "return_logprob": args.return_logprob,
        "logprob_start_len": -1,
        **args.extra_body,
    }
    output = RequestFuncOutput(prompt_len=row.prompt_len)
    generated_text = ""
    ttft = 0.0
    st = time.perf_counter()
    output.start_time = st
    most_recent = st
    last_output_len = 0
    output_len_seen = output_len
    writer = None
    try:
        status, reason, headers, reader, writer = await _post(api_url, payload, get_auth_headers())
        if status == 200:
            buffer = b""
            latency = 0.0
            async for data in _chunks(reader, headers):
                buffer += data
                *lines, buffer = buffer.split(b"\n")
                for raw in lines:
                    raw = raw.strip()
                    if not raw:
                        continue
                    chunk = raw.decode("utf-8")
                    chunk = chunk[len("data: "):] if chunk.startswith("data: ") else chunk
                    latency = time.perf_counter() - st
                    if chunk == "[DONE]":
                        continue
                    data_obj = json.loads(chunk)
                    if "text" in data_obj and data_obj["text"]:
                        timestamp = time.perf_counter()
                        generated_text = data_obj["text"]
                        output_len_seen = data_obj["meta_info"]["completion_tokens"]
                        if ttft == 0.0:
                            ttft = time.perf_counter() - st
                            output.ttft = ttft
                        else:
                            new_tokens = output_len_seen - last_output_len
                            if new_tokens == 0:
                                continue
                            gap = timestamp - most_recent
                            output.itl.extend([gap / new_tokens] * new_tokens)
                        most_recent = timestamp
                        last_output_len = output_len_seen
            output.generated_text = generated_text
            output.success = True
            output.latency = latency
            output.output_len = output_len_seen
        else:
            text = b"".join([d async for d in _chunks(reader, headers)]).decode("utf-8", "replace")
            output.error = (reason or "") + ": " + text
            output.success = False
    except Exception:  # the real client records any failure of a request and goes on
        output.success = False
        output.error = "".join(traceback.format_exception(*sys.exc_info()))
        print(f"{output.error=}")
    finally:
        if writer is not None:
            writer.close()
    if pbar is not None:
        pbar.update(1)
    return output


class Progress:
    """A minimal stand-in for tqdm (stderr, one line rewritten)."""

    def __init__(self, total):
        self.total = total
        self.n = 0
        self.start = time.perf_counter()

    def update(self, n):
        self.n += n
        elapsed = time.perf_counter() - self.start
        rate = self.n / elapsed if elapsed > 0 else 0.0
        sys.stderr.write("\r%3d%%| %d/%d [%.0fs, %.2fit/s]" % (100 * self.n // max(self.total, 1), self.n,
                                                               self.total, elapsed, rate))
        sys.stderr.flush()

    def close(self):
        sys.stderr.write("\n")


# ---------------------------------------------------------------------------------------------- metrics
def calculate_metrics(rows, outputs, dur_s):
    output_lens, itls, tpots, ttfts, e2e = [], [], [], [], []
    total_input = completed = 0
    for row, out in zip(rows, outputs):
        if out.success:
            output_lens.append(out.output_len)
            total_input += row.prompt_len
            if out.output_len > 1:
                tpots.append((out.latency - out.ttft) / (out.output_len - 1))
            itls += out.itl
            ttfts.append(out.ttft)
            e2e.append(out.latency)
            completed += 1
        else:
            output_lens.append(0)
    if completed == 0:
        warnings.warn("All requests failed. This is likely due to a misconfiguration on the benchmark arguments.",
                      stacklevel=2)
    max_tokens_per_s, max_concurrent = 0.0, 0
    ok = [o for o in outputs if o.success]
    if ok:
        t0 = min(o.start_time for o in ok)
        t1 = max(o.start_time + o.latency for o in ok)
        buckets = int(math.ceil(t1 - t0)) + 1
        tokens = [0] * buckets
        concurrent = [0] * buckets
        for o in ok:
            times = [o.start_time + o.ttft]
            for gap in o.itl:
                times.append(times[-1] + gap)
            for t in times:
                b = int(t - t0)
                if 0 <= b < buckets:
                    tokens[b] += 1
            for second in range(int(o.start_time - t0), min(int(o.start_time + o.latency - t0) + 1, buckets)):
                concurrent[second] += 1
        max_tokens_per_s = float(max(tokens))
        max_concurrent = int(max(concurrent))
    total_output = sum(output_lens)
    m = {
        "completed": completed,
        "total_input": total_input,
        "total_output": total_output,
        "request_throughput": completed / dur_s,
        "input_throughput": total_input / dur_s,
        "output_throughput": total_output / dur_s,
        "total_throughput": (total_input + total_output) / dur_s,
        "mean_ttft_ms": mean(or_zero(ttfts)) * 1000, "median_ttft_ms": median(or_zero(ttfts)) * 1000,
        "std_ttft_ms": std(or_zero(ttfts)) * 1000, "p90_ttft_ms": percentile(or_zero(ttfts), 90) * 1000,
        "p95_ttft_ms": percentile(or_zero(ttfts), 95) * 1000, "p99_ttft_ms": percentile(or_zero(ttfts), 99) * 1000,
        "mean_tpot_ms": mean(or_zero(tpots)) * 1000, "median_tpot_ms": median(or_zero(tpots)) * 1000,
        "std_tpot_ms": std(or_zero(tpots)) * 1000, "p90_tpot_ms": percentile(or_zero(tpots), 90) * 1000,
        "p95_tpot_ms": percentile(or_zero(tpots), 95) * 1000, "p99_tpot_ms": percentile(or_zero(tpots), 99) * 1000,
        "mean_itl_ms": mean(or_zero(itls)) * 1000, "median_itl_ms": median(or_zero(itls)) * 1000,
        "std_itl_ms": std(or_zero(itls)) * 1000, "p90_itl_ms": percentile(or_zero(itls), 90) * 1000,
        "p95_itl_ms": percentile(or_zero(itls), 95) * 1000,
        "p99_itl_ms": percentile(or_zero(itls), 99) * 1000, "max_itl_ms": max(or_zero(itls)) * 1000,
        "mean_e2e_latency_ms": mean(e2e) * 1000, "median_e2e_latency_ms": median(e2e) * 1000,
        "std_e2e_latency_ms": std(e2e) * 1000,
        "p90_e2e_latency_ms": percentile(e2e, 90) * 1000 if e2e else float("nan"),
        "p95_e2e_latency_ms": percentile(e2e, 95) * 1000 if e2e else float("nan"),
        "p99_e2e_latency_ms": percentile(e2e, 99) * 1000 if e2e else float("nan"),
        "concurrency": sum(e2e) / dur_s,
        "max_output_tokens_per_s": max_tokens_per_s,
        "max_concurrent_requests": max_concurrent,
    }
    return m, output_lens


# The summary table as each release prints it: (section title or None, label, metrics key, float format?, since)
# (59:sglang/bench_serving.py:2560-2660, 523:sglang/benchmark/serving.py:1680-1795)
SUMMARY = [
    (None, "Successful requests:", "completed", False, None),
    (None, "Benchmark duration (s):", "duration", True, None),
    (None, "Total input tokens:", "total_input", False, None),
    (None, "Total input text tokens:", "total_input", False, None),
    (None, "Total generated tokens:", "total_output", False, None),
    (None, "Total generated tokens (retokenized):", "total_output", False, None),
    (None, "Request throughput (req/s):", "request_throughput", True, None),
    (None, "Input token throughput (tok/s):", "input_throughput", True, None),
    (None, "Output token throughput (tok/s):", "output_throughput", True, None),
    (None, "Peak output token throughput (tok/s):", "max_output_tokens_per_s", True, None),
    (None, "Peak concurrent requests:", "max_concurrent_requests", False, None),
    (None, "Total token throughput (tok/s):", "total_throughput", True, None),
    (None, "Concurrency:", "concurrency", True, None),
    ("End-to-End Latency", "Mean E2E Latency (ms):", "mean_e2e_latency_ms", True, None),
    (None, "Median E2E Latency (ms):", "median_e2e_latency_ms", True, None),
    (None, "P90 E2E Latency (ms):", "p90_e2e_latency_ms", True, None),
    (None, "P95 E2E Latency (ms):", "p95_e2e_latency_ms", True, "0.5.23"),
    (None, "P99 E2E Latency (ms):", "p99_e2e_latency_ms", True, None),
    ("Time to First Token", "Mean TTFT (ms):", "mean_ttft_ms", True, None),
    (None, "Median TTFT (ms):", "median_ttft_ms", True, None),
    (None, "P90 TTFT (ms):", "p90_ttft_ms", True, "0.5.23"),
    (None, "P95 TTFT (ms):", "p95_ttft_ms", True, "0.5.23"),
    (None, "P99 TTFT (ms):", "p99_ttft_ms", True, None),
    ("Time per Output Token (excl. 1st token)", "Mean TPOT (ms):", "mean_tpot_ms", True, None),
    (None, "Median TPOT (ms):", "median_tpot_ms", True, None),
    (None, "P90 TPOT (ms):", "p90_tpot_ms", True, "0.5.23"),
    (None, "P95 TPOT (ms):", "p95_tpot_ms", True, "0.5.23"),
    (None, "P99 TPOT (ms):", "p99_tpot_ms", True, None),
    ("Inter-Token Latency", "Mean ITL (ms):", "mean_itl_ms", True, None),
    (None, "Median ITL (ms):", "median_itl_ms", True, None),
    (None, "P90 ITL (ms):", "p90_itl_ms", True, "0.5.23"),
    (None, "P95 ITL (ms):", "p95_itl_ms", True, None),
    (None, "P99 ITL (ms):", "p99_itl_ms", True, None),
    (None, "Max ITL (ms):", "max_itl_ms", True, None),
]

# The latency keys of the JSON line, in each release's order (59:sglang/bench_serving.py:2670-2717,
# 523:sglang/benchmark/serving.py:1855-1907); 0.5.23 adds the p90/p95 ones and removes none.
LATENCY_KEYS = {
    "0.5.9": ["mean_e2e_latency_ms", "median_e2e_latency_ms", "std_e2e_latency_ms", "p90_e2e_latency_ms",
              "p99_e2e_latency_ms", "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
              "median_tpot_ms", "std_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "std_itl_ms",
              "p95_itl_ms", "p99_itl_ms", "concurrency"],
    "0.5.23": ["mean_e2e_latency_ms", "median_e2e_latency_ms", "std_e2e_latency_ms", "p90_e2e_latency_ms",
               "p95_e2e_latency_ms", "p99_e2e_latency_ms", "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms",
               "p90_ttft_ms", "p95_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "std_tpot_ms",
               "p90_tpot_ms", "p95_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "std_itl_ms",
               "p90_itl_ms", "p95_itl_ms", "p99_itl_ms", "concurrency"],
}


def latency_keys():
    return LATENCY_KEYS["0.5.23" if release.at_least("0.5.23") else "0.5.9"]


def print_summary(args, m, duration):
    """SGLang's result table: 40-wide labels, 10-wide values, dashed section titles."""
    values = dict(m, duration=duration)
    print("\n{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="))
    print("{:<40} {:<10}".format("Backend:", args.backend))
    print("{:<40} {:<10}".format("Traffic request rate:", args.request_rate))
    print("{:<40} {:<10}".format("Max request concurrency:", args.max_concurrency or "not set"))
    for section, label, key, is_float, since in SUMMARY:
        if since and not release.at_least(since):
            continue
        if section:
            print("{s:{c}^{n}}".format(s=section, n=50, c="-"))
        print(("{:<40} {:<10.2f}" if is_float else "{:<40} {:<10}").format(label, values[key]))
    print("=" * 50)


def get_json(url):
    request = urllib.request.Request(url, headers=get_auth_headers())
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, None


def wait_for_endpoint(url, timeout_sec=60):
    """0.5.23: poll the URL once a second until it answers 200 (523:sglang/benchmark/serving.py:158-175)."""
    print(f"Waiting up to {timeout_sec}s for {url} to become ready...")
    start = time.perf_counter()
    while True:
        try:
            if get_json(url)[0] == 200:
                print(f"Server ready in {time.perf_counter() - start:.1f}s.")
                return True
        except (OSError, ValueError):
            pass
        if time.perf_counter() - start >= timeout_sec:
            print(f"Server did not become ready within {timeout_sec}s timeout.")
            return False
        time.sleep(1)


# ---------------------------------------------------------------------------------------------- benchmark
async def request_times(rows, rate, rng):
    for row in rows:
        yield row
        if rate == float("inf"):
            continue
        await asyncio.sleep(rng.expovariate(rate))


async def benchmark(args, api_url, base_url, rows, rng):
    semaphore = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None

    async def limited(row, pbar):
        if semaphore is None:
            return await async_request_sglang_generate(args, api_url, row, row.output_len, pbar)
        async with semaphore:
            return await async_request_sglang_generate(args, api_url, row, row.output_len, pbar)

    print("Starting warmup with %d sequences..." % args.warmup_requests)
    warmups = await asyncio.gather(*[
        async_request_sglang_generate(args, api_url, rows[0], min(rows[0].output_len, 32))
        for _ in range(args.warmup_requests)])
    if args.warmup_requests > 0 and not any(o.success for o in warmups):
        raise ValueError("Warmup failed - Please make sure benchmark arguments are correctly specified. Error: %s"
                         % warmups[0].error)
    print("Warmup completed with %d sequences. Starting main benchmark run..." % args.warmup_requests)
    if args.flush_cache:
        urllib.request.urlopen(urllib.request.Request(base_url + "/flush_cache", method="POST",
                                                      headers=get_auth_headers()), timeout=60).read()
    await asyncio.sleep(1.0)  # bench_serving pauses one second between warmup and the run

    start = time.perf_counter()
    pbar = None if args.disable_tqdm else Progress(len(rows))
    tasks = []
    async for row in request_times(rows, args.request_rate, rng):
        tasks.append(asyncio.create_task(limited(row, pbar)))
    outputs = await asyncio.gather(*tasks)
    if pbar is not None:
        pbar.close()
    duration = time.perf_counter() - start
    return outputs, duration


def run_benchmark(args):
    print(f"benchmark_args={args}")
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < 65535:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(65535, hard), hard))
    except (ValueError, OSError) as err:
        print(f"Fail to set RLIMIT_NOFILE: {err}")
    rng = random.Random(args.seed)
    args.extra_body = json.loads(args.extra_request_body) if args.extra_request_body else {}
    if args.port is None:
        args.port = 30000
    base_url = args.base_url.rstrip("/") if args.base_url else "http://%s:%d" % (args.host, args.port)
    api_url = base_url + "/generate"
    if release.at_least("0.5.23") and args.ready_check_timeout_sec > 0:
        if not wait_for_endpoint(base_url + "/v1/models", args.ready_check_timeout_sec):
            print(f"Server at {base_url}/v1/models is not ready. Exiting.")
            sys.exit(1)
    if args.model is None:
        try:
            _, models = get_json(base_url + "/v1/models")
            data = (models or {}).get("data", [])
            args.model = data[0]["id"] if data else None
        except (OSError, ValueError) as err:
            print(f"Failed to fetch model from {base_url}/v1/models. Error: {err}")
            print("Please specify the correct host and port using `--host` and `--port`.")
            sys.exit(1)
    if args.model is None:
        print("No model specified or found. Please provide a model using `--model`.")
        sys.exit(1)
    print(f"{args}\n")
    rows = sample_random_ids(args, rng)
    outputs, duration = asyncio.run(benchmark(args, api_url, base_url, rows, rng))
    metrics, output_lens = calculate_metrics(rows, outputs, duration)
    print_summary(args, metrics, duration)
    try:  # 0.5.9 reads the deprecated /get_server_info (59:bench_serving.py:2663), 0.5.23 /server_info (523:1847)
        status, server_info = get_json(base_url + ("/server_info" if release.at_least("0.5.23") else
                                                   "/get_server_info"))
    except (OSError, ValueError):
        status, server_info = None, None
    if status != 200:
        server_info = None
    result = {
        "tag": args.tag,
        "backend": args.backend,
        "dataset_name": args.dataset_name,
        "request_rate": args.request_rate,
        "max_concurrency": args.max_concurrency,
        "sharegpt_output_len": args.sharegpt_output_len,
        "random_input_len": args.random_input_len,
        "random_output_len": args.random_output_len,
        "random_range_ratio": args.random_range_ratio,
        "server_info": server_info,
        "duration": duration,
        "completed": metrics["completed"],
        "total_input_tokens": metrics["total_input"],
        "total_input_text_tokens": metrics["total_input"],
        "total_input_vision_tokens": 0,
        "total_output_tokens": metrics["total_output"],
        "total_output_tokens_retokenized": metrics["total_output"],
        "request_throughput": metrics["request_throughput"],
        "input_throughput": metrics["input_throughput"],
        "output_throughput": metrics["output_throughput"],
        "total_throughput": metrics["total_throughput"],
    }
    for key in latency_keys():
        result[key] = metrics[key]
    result["accept_length"] = None
    result["max_output_tokens_per_s"] = metrics["max_output_tokens_per_s"]
    result["max_concurrent_requests"] = metrics["max_concurrent_requests"]
    output_file = args.output_file or "%s_%s_%d_%d_%d.jsonl" % (
        args.backend, datetime.now().strftime("%m%d"), args.num_prompts, args.random_input_len,
        args.random_output_len)
    details = {"input_lens": [o.prompt_len for o in outputs], "output_lens": output_lens,
               "ttfts": [o.ttft for o in outputs], "itls": [o.itl for o in outputs],
               "generated_texts": [o.generated_text for o in outputs], "errors": [o.error for o in outputs]}
    with open(output_file, "a", encoding="utf-8") as f:
        f.write(json.dumps(dict(result, **details) if args.output_details else result) + "\n")
    return dict(result, **details)


def build_parser():
    parser = argparse.ArgumentParser(description="Benchmark the online serving throughput.")
    parser.add_argument("--backend", type=str, choices=list(BACKENDS), default="sglang")
    parser.add_argument("--base-url", type=str, default=None)
    parser.add_argument("--host", type=str, default="0.0.0.0")
    parser.add_argument("--port", type=int)
    if release.at_least("0.5.23"):
        parser.add_argument("--ready-check-timeout-sec", type=int, default=60)
    parser.add_argument("--dataset-name", type=str, default="sharegpt",
                        choices=["sharegpt", "custom", "openai", "random", "random-ids", "generated-shared-prefix",
                                 "mmmu", "image", "mooncake"])
    parser.add_argument("--dataset-path", type=str, default="")
    parser.add_argument("--model", type=str)
    parser.add_argument("--served-model-name", type=str)
    parser.add_argument("--tokenizer", type=str)
    parser.add_argument("--num-prompts", type=int, default=1000)
    parser.add_argument("--sharegpt-output-len", type=int, default=None)
    parser.add_argument("--sharegpt-context-len", type=int, default=None)
    parser.add_argument("--random-input-len", type=int, default=1024)
    parser.add_argument("--random-output-len", default=1024, type=int)
    parser.add_argument("--random-range-ratio", type=float, default=0.0)
    parser.add_argument("--request-rate", type=float, default=float("inf"))
    parser.add_argument("--max-concurrency", type=int, default=None)
    parser.add_argument("--output-file", type=str)
    parser.add_argument("--output-details", action="store_true")
    parser.add_argument("--disable-tqdm", action="store_true")
    parser.add_argument("--disable-stream", action="store_true")
    parser.add_argument("--return-logprob", action="store_true")
    parser.add_argument("--seed", type=int, default=42 if release.at_least("0.5.23") else 1)
    parser.add_argument("--disable-ignore-eos", action="store_true")
    parser.add_argument("--extra-request-body", metavar='{"key1": "value1", "key2": "value2"}', type=str)
    parser.add_argument("--apply-chat-template", action="store_true")
    parser.add_argument("--flush-cache", action="store_true")
    parser.add_argument("--warmup-requests", type=int, default=1)
    parser.add_argument("--tokenize-prompt", action="store_true")
    parser.add_argument("--tag", type=str, default=None)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    version = release.sim_version()
    if args.dataset_name != "random-ids":
        print("The lab's benchmark client (sglang %s) cannot use dataset %r: SGLang downloads it (ShareGPT / traces "
              "/ images) and the lab has no network. Use --dataset-name random-ids." % (version, args.dataset_name))
        return 1
    if args.backend not in ("sglang", "sglang-native"):
        print("The lab's benchmark client (sglang %s) simulates --backend sglang only, got %r." % (version,
                                                                                                   args.backend))
        return 1
    if args.num_prompts < 1:
        print("--num-prompts must be at least 1, got %d" % args.num_prompts)
        return 1
    print("sglang %s: the lab's benchmark client; results against the simulator are simulated." % version)
    run_benchmark(args)
    return 0


def cli_main():
    """sglang.benchmark.serving.cli_main (0.5.23's entry point)."""
    sys.exit(main())
