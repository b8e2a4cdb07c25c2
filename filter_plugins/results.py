"""Filters for what the bench stage measures and where the results are filed (the results tree:
plugin_utils/results.py).

    plan | topolaunch.sglang.results_fingerprint          the fingerprint a plan's results are filed under
    concurrency | topolaunch.sglang.bench_points(workload_concurrency, prompts_per_concurrency, min_prompts)
    candidates | topolaunch.sglang.sweep_layouts(top)      the layouts a sweep measures by default
    point | topolaunch.sglang.slo_verdict(slo)              whether a measured point met the workload's SLO
    artifacts_dir | topolaunch.sglang.artifacts_host_dir(host)  artifacts/<host> of one host, inside artifacts_dir
"""
from ansible.errors import AnsibleFilterError

from ansible_collections.topolaunch.sglang.plugins.module_utils.plan_score import measured_slo_misses
from ansible_collections.topolaunch.sglang.plugins.module_utils.planner import describe_slo
from ansible_collections.topolaunch.sglang.plugins.plugin_utils.results import ResultsError, artifacts_host_dir, filed_under


def results_fingerprint(plan):
    """The fingerprint a plan's results are filed under (a server across nodes: its cluster fingerprint)."""
    return filed_under(plan)[1]


def bench_points(concurrency, workload_concurrency, prompts_per_concurrency, min_prompts):
    """The bench's points, ascending: each concurrency and the workload's (the planner ranks layouts by measurements
    at it), each with max(concurrency x prompts_per_concurrency, min_prompts) prompts."""
    levels = sorted({int(c) for c in list(concurrency or []) + [workload_concurrency]})
    return [{"max_concurrency": c, "num_prompts": max(c * int(prompts_per_concurrency), int(min_prompts))}
            for c in levels]


def sweep_layouts(candidates, top):
    """The best valid candidate of each distinct tp/pp/dp shape, best first (candidates come best first), at most
    `top`: expert-parallel variants of one shape score alike and would crowd out the comparison that matters."""
    names, shapes = [], set()
    for c in candidates or []:
        shape = (c.get("tp"), c.get("pp"), c.get("dp"))
        if c.get("valid") and shape not in shapes and len(names) < int(top):
            shapes.add(shape)
            names.append(c["name"])
    return names


def slo_verdict(point, slo):
    """One line: whether a measured point (results: ttft_p99_ms, tpot_p50_ms, ...) met the SLO (the plan's
    workload.slo, percentiles filled in), judged on the SLO's percentiles as the planner judges it."""
    misses = measured_slo_misses(slo, point)
    verdict = "missed: " + ", ".join(misses) if misses else "met"
    return "concurrency %s: SLO %s %s" % (point.get("max_concurrency"), describe_slo(slo), verdict)


def host_artifacts_dir(artifacts_dir, host):
    """artifacts_dir/<host>, the host name one safe path component (results.artifacts_host_dir)."""
    try:
        return artifacts_host_dir(artifacts_dir, host)
    except ResultsError as exc:
        raise AnsibleFilterError("inventory host %r cannot name a folder of %s: %s" % (host, artifacts_dir, exc))


class FilterModule:
    """topolaunch.sglang results filters."""

    def filters(self):
        return {"results_fingerprint": results_fingerprint, "bench_points": bench_points,
                "sweep_layouts": sweep_layouts, "slo_verdict": slo_verdict, "artifacts_host_dir": host_artifacts_dir}
