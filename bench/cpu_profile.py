"""Where a worker's CPU goes, by function and by library: py-spy attached to real workers.

    python bench/cpu_profile.py alone --steps 2000          # one long run, one worker
    python bench/cpu_profile.py load --runs 1000 --steps 5  # model_wait's load, 2 workers
    python bench/cpu_profile.py load --in-process           # batch_throughput's load

`alone` runs one run of N steps (scripted model) through one worker; `load` runs R runs x S
steps on a model that takes L seconds (the local Messages API server, the real SDK; or, with
--in-process, the scripted model sleeping L seconds in the worker) through P workers. py-spy
samples the workers (`--gil`: only the thread holding the GIL, i.e. the Python work that
bounds a process; `--all` samples every running thread instead) while the measured runs go
through, and the samples are scaled to the workers' measured CPU a step.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import cpu_use
import output
import records
import scratch

NAME = "cpu_profile"
REDIS_DB = 8
SPY = str(Path(sys.executable).with_name("py-spy"))

# A sample goes to the first of these its stack matches, searched from the innermost frame
# outwards: JSON encoding called by SQLAlchemy is JSON, a socket write by redis-py is the broker.
CATEGORIES: list[tuple[str, str]] = [
    ("JSON encode/decode (json module)", r"/json/(encoder|decoder|__init__)\.py"),
    ("logging", r"/logging/|celery/utils/log\.py"),
    ("jsonschema (tool arguments, input)", r"/(jsonschema|referencing|rpds)/"),
    ("anthropic SDK + pydantic (request, reply parsing)", r"/(anthropic|pydantic|pydantic_core)/"),
    ("httpx/httpcore (model HTTP)", r"/(httpx|httpx2|httpcore|h11|anyio)/"),
    ("opentelemetry", r"/opentelemetry/"),
    ("psycopg (driver; libpq work)", r"/psycopg/"),
    ("SQLAlchemy Core/ORM (statements, results, pool)", r"/sqlalchemy/"),
    ("Celery task events", r"celery/events/"),
    ("Celery result backend", r"celery/backends/"),
    ("kombu + redis-py (broker I/O)", r"/(kombu|redis)/"),
    ("Celery worker machinery (trace, request, consumer)", r"/(celery|billiard|vine)/"),
    ("gevent hub / greenlets", r"/gevent/"),
    ("nightshift's own code (pipeline/)", r"/pipeline/"),
    ("threads, queues, locks (stdlib)", r"/(threading|queue|concurrent/futures/thread)\.py"),
]


def parse(path: Path) -> list[tuple[list[str], int]]:
    """py-spy --format raw: `frame;frame;... count` per line, outermost frame first."""
    samples = []
    # Not splitlines(): a frame's name may hold \x1c or \u2028, which it splits on too.
    for line in path.read_text(errors="replace").split("\n"):
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
            samples.append((frames, int(count)))
    return samples


def category(frames: list[str], compiled: list[tuple[str, re.Pattern[str]]]) -> str:
    for frame in reversed(frames):
        for label, pattern in compiled:
            if pattern.search(frame):
                return label
    return "other (interpreter, stdlib)"


def short(frame: str) -> str:
    """`func (/a/b/site-packages/lib/mod.py:12)` -> `func (lib/mod.py)`."""
    match = re.match(r"^(.*?) \((.*?)(?::\d+)?\)$", frame)
    if not match:
        return frame
    func, path = match.groups()
    for marker in ("site-packages/", "/pipeline/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            path = ("pipeline/" + path) if marker == "/pipeline/" else path
            break
    return f"{func} ({path.split('/', 1)[-1] if path.startswith('3.') else path})"


def report(raws: list[Path], cpu_ms: float, top: int) -> list[list[str]]:
    samples = [s for raw in raws for s in parse(raw)]
    total = sum(n for _, n in samples) or 1
    compiled = [(label, re.compile(rx)) for label, rx in CATEGORIES]
    by_category: Counter[str] = Counter()
    by_function: Counter[str] = Counter()
    for frames, count in samples:
        by_category[category(frames, compiled)] += count
        by_function[short(frames[-1]) if frames else "?"] += count
    rows = [
        [label, f"{n / total:.1%}", output.ms(cpu_ms / 1000 * n / total)]
        for label, n in by_category.most_common()
    ]
    output.print_table(
        f"CPU by library ({total} samples, scaled to {cpu_ms:.2f} ms of worker CPU a step)",
        ["where", "share", "per step"],
        rows,
    )
    output.print_table(
        f"top {top} functions by own time",
        ["function", "share", "per step"],
        [
            [name[:100], f"{n / total:.1%}", output.ms(cpu_ms / 1000 * n / total)]
            for name, n in by_function.most_common(top)
        ],
    )
    return rows


def spy(pid: int, out: Path, rate: int, gil: bool) -> subprocess.Popen[bytes]:
    argv = [
        SPY, "record", "--pid", str(pid), "--rate", str(rate), "--nonblocking",
        "--format", "raw", "-o", str(out), "--full-filenames", "--subprocesses",
        *(["--gil"] if gil else []),
    ]  # fmt: skip
    return subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )


def stop(spies: list[subprocess.Popen[bytes]]) -> None:
    for process in spies:
        os.killpg(process.pid, signal.SIGINT)
    for process in spies:
        process.wait(timeout=120)


def main(argv: list[str] | None = None) -> int:
    parser = output.parser(__doc__)
    parser.add_argument("mode", choices=["alone", "load"])
    parser.add_argument("--steps", type=int, help="steps a run (alone 2000, load 5)")
    parser.add_argument("--runs", type=int, default=1000, help="load: runs (default 1000)")
    parser.add_argument("--latency", type=float, default=0.5, help="load: model seconds")
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="load: the scripted model sleeping --latency in the worker (batch_throughput's "
        "workload) instead of the SDK and the local Messages API server",
    )
    parser.add_argument("--processes", type=int, default=2, help="load: worker processes")
    parser.add_argument("--pool", default=None, help="worker pool (default: as configured)")
    parser.add_argument("--concurrency", type=int, help="slots a worker (alone 1, load 100)")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples a second")
    parser.add_argument("--all", action="store_true", help="every running thread, not --gil")
    parser.add_argument("--top", type=int, default=30, help="functions listed")
    parser.add_argument("--out", type=Path, help="keep py-spy's raw output here")
    args = parser.parse_args(argv)
    alone = args.mode == "alone"
    steps = args.steps or (2000 if alone else 5)
    runs = 1 if alone else args.runs
    processes = 1 if alone else args.processes
    concurrency = args.concurrency or (1 if alone else 100)
    pool = {"pool": args.pool} if args.pool else {}
    out = args.out or Path(os.environ.get("TMPDIR", "/tmp")) / f"nsbench-spy-{os.getpid()}"
    out.mkdir(parents=True, exist_ok=True)

    with scratch.model_server(args.latency) as server:
        model_url = None if alone or args.in_process else server.url
        with scratch.scratch(NAME, REDIS_DB, keep_logs=args.keep_logs, model_url=model_url) as b:
            workers = [
                b.worker(f"w{i + 1}", concurrency=concurrency, **pool) for i in range(processes)
            ]
            warm = concurrency * processes if not alone else 1
            records.create_runs(warm, 2 if alone else 1, "warmup")
            records.wait_for_runs(warm, timeout=180, label="warm-up runs")
            raws = [out / f"w{i + 1}.raw" for i in range(processes)]
            spies = [
                spy(w.pid, raw, args.rate, gil=not args.all)
                for w, raw in zip(workers, raws, strict=True)
            ]
            time.sleep(2.0)  # py-spy attaches
            with cpu_use.CpuMeter(b.processes) as cpu:
                latency = args.latency if args.in_process else 0
                _, started = records.create_runs(runs, steps, "measured", model_seconds=latency)
                wall = records.wait_for_runs(
                    warm + runs, timeout=600 + steps, label="runs", started=started
                )
            stop(spies)
    total = runs * steps
    per_step = cpu.seconds.get("workers", 0.0) / total * 1000
    output.print_table(
        f"cpu_profile {args.mode}: {runs} run(s) x {steps} steps, {processes} worker(s) "
        f"x{concurrency}{' ' + args.pool if args.pool else ''}"
        + ("" if alone else f", model {args.latency:g} s")
        + (" in process" if args.in_process else ""),
        ["", ""],
        [
            ["wall", output.secs(wall)],
            ["steps/s", f"{total / wall:.0f}"],
            ["worker CPU a step (user + system)", output.ms(per_step / 1000)],
            ["machine", cpu.describe()],
            ["CPU by process, cores", cpu.breakdown()],
        ],
    )
    output.print_notes(b.machine(), f"py-spy {'all running threads' if args.all else '--gil'}")
    report(raws, per_step, args.top)
    if args.out is None:
        for raw in raws:
            raw.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
