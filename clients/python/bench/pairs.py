"""Acquire + release pairs through the redsem package against a raw redis-py client sending
the same commands itself, measured side by side: rounds of each in turn, so both see the same
load. Prints, for redis-py sync and asyncio, the median time per pair of each and their ratio.

    python clients/python/bench/pairs.py [--port 6379] [--scripts] [--pairs 200] [--rounds 40]

Without --port it starts a redis-server (REDIS_SERVER, default redis-server) on a free port,
with the module REDSEM_MODULE loaded (default target/debug/libredsem.so of the repository), or
without it with --scripts: then both sides run the script (EVALSHA). The raw side makes a UUID
per pair as the package does (an acquire needs an identifier).
"""

import argparse
import asyncio
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import redis
import redis.asyncio

import redsem

ROOT = Path(__file__).resolve().parents[3]
NAME = "bench:pairs"
KEYS = [NAME + suffix for suffix in ("", ":owner", ":counter", ":permits", ":limit", ":wake")]


def start_server(scripts: bool):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    folder = tempfile.mkdtemp(prefix="redsem-bench-")
    command = [os.environ.get("REDIS_SERVER") or "redis-server", "--port", str(port)]
    command += ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", folder]
    if not scripts:
        module = os.environ.get("REDSEM_MODULE") or str(ROOT / "target/debug/libredsem.so")
        command += ["--loadmodule", module]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    probe = redis.Redis(port=port)
    for _ in range(200):
        try:
            probe.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    probe.close()
    return port, process, folder


def raw_commands(r, scripts: bool):
    """The acquire and release as the raw client sends them."""
    if not scripts:
        return (
            lambda ident: r.execute_command("SEM.ACQUIRE", NAME, 5, "30.000", "ID", ident),
            lambda ident: r.execute_command("SEM.RELEASE", NAME, ident),
        )
    sha = r.script_load(redsem._script()[0])
    return (
        lambda ident: r.evalsha(sha, 6, *KEYS, "ACQUIRE", 5, "30.000", "ID", ident),
        lambda ident: r.evalsha(sha, 6, *KEYS, "RELEASE", ident),
    )


def sync_round(r, scripts: bool, pairs: int):
    acquire, release = raw_commands(r, scripts)
    sem = redsem.Semaphore(r, NAME, limit=5, lease=30)

    def raw() -> float:
        started = time.perf_counter()
        for _ in range(pairs):
            ident = str(uuid.uuid4())
            assert acquire(ident) is not None
            assert release(ident) == 1
        return (time.perf_counter() - started) / pairs

    def package() -> float:
        started = time.perf_counter()
        for _ in range(pairs):
            permit = sem.acquire()
            assert permit.release()
        return (time.perf_counter() - started) / pairs

    return raw, package


def async_round(r, scripts: bool, pairs: int):
    if scripts:
        sha = redsem._script()[1]

        async def acquire(ident):
            return await r.evalsha(sha, 6, *KEYS, "ACQUIRE", 5, "30.000", "ID", ident)

        async def release(ident):
            return await r.evalsha(sha, 6, *KEYS, "RELEASE", ident)

    else:

        async def acquire(ident):
            return await r.execute_command("SEM.ACQUIRE", NAME, 5, "30.000", "ID", ident)

        async def release(ident):
            return await r.execute_command("SEM.RELEASE", NAME, ident)

    sem = redsem.AsyncSemaphore(r, NAME, limit=5, lease=30)

    async def raw() -> float:
        started = time.perf_counter()
        for _ in range(pairs):
            ident = str(uuid.uuid4())
            assert await acquire(ident) is not None
            assert await release(ident) == 1
        return (time.perf_counter() - started) / pairs

    async def package() -> float:
        started = time.perf_counter()
        for _ in range(pairs):
            permit = await sem.acquire()
            assert await permit.release()
        return (time.perf_counter() - started) / pairs

    return raw, package


def report(label: str, raws, packages) -> None:
    ratios = sorted(p / r for r, p in zip(raws, packages))
    print(
        f"{label}: raw {statistics.median(raws) * 1e6:.0f} us/pair, package "
        f"{statistics.median(packages) * 1e6:.0f} us/pair, package/raw median "
        f"{statistics.median(ratios):.2f} (middle half of the rounds "
        f"{ratios[len(ratios) // 4]:.2f}-{ratios[3 * len(ratios) // 4]:.2f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int)
    parser.add_argument("--scripts", action="store_true", help="no module: the script")
    parser.add_argument("--pairs", type=int, default=200, help="pairs per round")
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    process = folder = None
    port = args.port
    if port is None:
        port, process, folder = start_server(args.scripts)
    try:
        backend = "script (EVALSHA)" if args.scripts else "module"
        print(f"redis-py {redis.__version__}, Python {sys.version.split()[0]}, {backend}, "
              f"{args.pairs} pairs x {args.rounds} rounds each, interleaved")
        r = redis.Redis(port=port)
        if args.scripts:  # the script (EVAL) needs no module; the package finds that out
            r.script_load(redsem._script()[0])
        raw, package = sync_round(r, args.scripts, args.pairs)
        raw(), package()  # warm up
        raws, packages = [], []
        for _ in range(args.rounds):
            raws.append(raw())
            packages.append(package())
        report("sync   ", raws, packages)
        r.close()

        async def run_async() -> None:
            ar = redis.asyncio.Redis(port=port)
            if args.scripts:
                await ar.script_load(redsem._script()[0])
            raw, package = async_round(ar, args.scripts, args.pairs)
            await raw(), await package()
            raws, packages = [], []
            for _ in range(args.rounds):
                raws.append(await raw())
                packages.append(await package())
            report("asyncio", raws, packages)
            await ar.aclose()

        asyncio.run(run_async())
    finally:
        if process is not None:
            process.kill()
            process.wait()
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
