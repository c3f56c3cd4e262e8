"""How the cost of `nomadtf render` grows with the number of workers.

For 10, 100 and 1,000 workers (the digits example with roles.worker.count overridden, as
`--var roles.worker.count=N` does) this times, per job: schema validation with defaults
and typing (`parse_spec`), rendering through the Jinja2 templates (`render_job`), the part of
that spent building the template set and compiling the templates (cached after the first
call: `render.template_set`), and validation plus rendering together; and compares the whole to `json.dumps` of the
same rendered job, the floor any renderer pays.

    python bench/bench_render.py [--repeat 7]

Not run by pytest.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from nomadtf.job.options import apply_overrides, read_options
from nomadtf.job.render import TEMPLATE_FILES, job_json, render_job, template_set
from nomadtf.job.spec import parse_spec

REPO = Path(__file__).resolve().parent.parent

SIZES = (10, 100, 1000)


def median_seconds(work: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def compile_templates() -> None:
    templates = template_set()
    for name in TEMPLATE_FILES:
        templates.get_template(name)


def validate_and_render(data: dict[str, Any]) -> dict[str, Any]:
    return render_job(parse_spec(data))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="runs per measurement; the median is shown")
    repeat = parser.parse_args().repeat

    options = read_options(REPO / "examples" / "digits" / "job.json")
    print(f"median of {repeat} runs per job, time.perf_counter")
    print(
        f"{'workers':>8} {'validate':>10} {'render':>10} {'(compile)':>10} {'total':>10} "
        f"{'json.dumps':>11} {'total/dumps':>12} {'job bytes':>10}"
    )
    for workers in SIZES:
        data = apply_overrides(options, [f"roles.worker.count={workers}"])
        spec = parse_spec(data)
        job = render_job(spec)
        assert next(g for g in job["Job"]["TaskGroups"] if g["Name"] == "worker")["Count"] == workers
        render_job(parse_spec(data))  # warm-up: imports, first-call caches

        validate = median_seconds(partial(parse_spec, data), repeat)
        render = median_seconds(partial(render_job, spec), repeat)
        compile_ = median_seconds(compile_templates, repeat)
        total = median_seconds(partial(validate_and_render, data), repeat)
        dumps = median_seconds(partial(json.dumps, job), repeat)
        size = len(job_json(job))
        print(
            f"{workers:>8} {validate * 1e3:>8.2f}ms {render * 1e3:>8.2f}ms {compile_ * 1e3:>8.2f}ms "
            f"{total * 1e3:>8.2f}ms {dumps * 1e3:>9.3f}ms {total / dumps:>11.0f}x {size:>10}"
        )


if __name__ == "__main__":
    main()
