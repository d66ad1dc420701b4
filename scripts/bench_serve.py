#!/usr/bin/env python
r"""Load test for ``nmt serve`` against ``nmt translate`` on the same sentences as a file.

Starts ``nmt serve`` on 127.0.0.1 (a free port), then for each client count N sends the test
sentences, ``--lines-per-request`` a request, from N concurrent clients that take the next
sentences from one shared list (so each sentence is asked for exactly once per level). Each
level stops after ``--max-seconds``. Reports requests/s, sentences/s and p50/p95/p99 request
latency per level, and the same sentences translated by ``nmt translate -i FILE``.

Every answer is checked against the file translation of the sentences it was asked for:
``errors`` (an error status, or as many translations as lines), ``lost`` (sentences without
an answer), ``mismatched`` (a different translation) and, of those, ``swapped`` (the
translation of some other sentence in the set) must all be 0.

Example (2 CPU threads for the model, beam 5, Multi30k test_2016_flickr):

    python scripts/bench_serve.py --checkpoint RUN/best.pt --clients 1 8 32 --threads 2 \
        --screenshot docs/serve.png
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nmt.data.corpus import read_lines


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def nmt_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "nmt", *args]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def translate_file(args, lines: list[str], work: Path) -> tuple[list[str], float | None]:
    """``nmt translate`` on ``lines``; returns its output and the seconds it took, start-up
    (the same command on one line) subtracted, or None where that difference is within a tenth
    of the start-up (too few lines to time apart from it: the rate would be noise, or negative)."""

    def run(name: str, text: list[str]) -> tuple[list[str], float]:
        src, out = work / f"{name}.en", work / f"{name}.de"
        src.write_text("".join(line + "\n" for line in text), encoding="utf-8")
        start = time.perf_counter()
        subprocess.run(
            nmt_command(
                "translate",
                "--checkpoint",
                args.checkpoint,
                "-i",
                str(src),
                "-o",
                str(out),
                "--beam-size",
                str(args.beam_size),
                "--threads",
                str(args.threads),
                "--max-tokens",
                str(args.max_batch_tokens),
            ),
            check=True,
            env=env(),
        )
        return out.read_text(encoding="utf-8").splitlines(), time.perf_counter() - start

    _, startup = run("one", lines[:1])
    hyps, total = run("all", lines)
    return hyps, total - startup if total - startup > 0.1 * startup else None


async def load(url: str, lines: list[str], clients: int, args) -> dict:
    """Send every line once from ``clients`` concurrent clients; check each answer."""
    chunks = [
        list(range(i, min(i + args.lines_per_request, len(lines))))
        for i in range(0, len(lines), args.lines_per_request)
    ]
    queue: asyncio.Queue[list[int]] = asyncio.Queue()
    for chunk in chunks:
        queue.put_nowait(chunk)
    answers: dict[int, str] = {}
    sent: list[int] = []
    latencies: list[float] = []
    errors: list[str] = []
    deadline = time.perf_counter() + args.max_seconds

    async def client(http: httpx.AsyncClient) -> None:
        while time.perf_counter() < deadline:
            try:
                chunk = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            sent.extend(chunk)
            start = time.perf_counter()
            response = await http.post(
                f"{url}/translate",
                json={"text": [lines[i] for i in chunk], "beam_size": args.beam_size},
            )
            latencies.append(time.perf_counter() - start)
            if response.status_code != 200:
                errors.append(f"{response.status_code}: {response.text[:200]}")
                continue
            translations = response.json()["translations"]
            if len(translations) != len(chunk):
                errors.append(f"{len(translations)} translations for {len(chunk)} lines")
                continue
            for i, translation in zip(chunk, translations):
                answers[i] = translation["text"]

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=args.max_seconds, limits=limits) as http:
        start = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        wall = time.perf_counter() - start
    return {
        "answers": answers,
        "sent": sent,
        "latencies": latencies,
        "errors": errors,
        "wall_s": wall,
    }


def check(answers: dict[int, str], sent: list[int], reference: list[str]) -> dict:
    """``sent``: the sentences asked for before the level's time ran out."""
    known = set(reference)
    mismatched = [i for i, text in answers.items() if text != reference[i]]
    return {
        "sent": len(sent),
        "lost": len(set(sent) - set(answers)),
        "mismatched": len(mismatched),
        "swapped": sum(answers[i] in known for i in mismatched),
    }


def screenshot(url: str, lines: list[str], path: Path) -> None:
    """The page after translating two sentences with a 3-best list, from headless chromium."""
    from playwright.sync_api import sync_playwright

    executable = next(
        (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
    )
    if executable is None:
        raise SystemExit("--screenshot needs chromium on PATH (apt-get install chromium)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 900, "height": 640})
        page.goto(url)
        page.wait_for_function("document.getElementById('pair').textContent.includes('→')")
        page.fill("#source", "\n".join(lines))
        page.fill("#n_best", "3")
        page.click("#translate")
        page.wait_for_function("document.getElementById('translation').textContent.length > 0")
        page.screenshot(path=str(path), full_page=True)
        browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="checkpoint file or run directory")
    parser.add_argument(
        "--data",
        default=os.environ.get("MULTI30K", str(ROOT.parent / "shared" / "data" / "multi30k")),
        help="Multi30k directory",
    )
    parser.add_argument("--split", default="test_2016_flickr")
    parser.add_argument(
        "--lines",
        type=int,
        default=1000,
        help="test sentences to send (each once per client count)",
    )
    parser.add_argument(
        "--clients",
        type=int,
        nargs="+",
        default=[1, 8, 32],
        help="concurrent clients, one level each (at most 256)",
    )
    parser.add_argument("--lines-per-request", type=int, default=1)
    parser.add_argument("--beam-size", type=int, default=5)
    parser.add_argument(
        "--threads", type=int, default=2, help="torch threads of the server and of nmt translate"
    )
    parser.add_argument("--max-batch-tokens", type=int, default=4096)
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument("--max-seconds", type=float, default=300.0, help="time limit of each level")
    parser.add_argument(
        "--screenshot", type=Path, help="also write a PNG of the web page here (needs chromium)"
    )
    args = parser.parse_args()
    if not all(1 <= c <= 256 for c in args.clients):
        parser.error("--clients: each count must be between 1 and 256")
    lines = read_lines(Path(args.data) / f"{args.split}.en.gz")[: args.lines]

    with tempfile.TemporaryDirectory() as tmp:
        reference, file_s = translate_file(args, lines, Path(tmp))
    rows = [
        {
            "mode": "nmt translate (file)",
            "clients": "",
            "requests_per_s": None,
            "sentences_per_s": None if file_s is None else len(lines) / file_s,
            "wall_s": file_s,
        }
    ]
    print(json.dumps(rows[0]), flush=True)

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        nmt_command(
            "serve",
            "--checkpoint",
            args.checkpoint,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--threads",
            str(args.threads),
            "--max-batch-tokens",
            str(args.max_batch_tokens),
            "--max-wait-ms",
            str(args.max_wait_ms),
            "--max-lines",
            str(max(64, args.lines_per_request)),
        ),
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(600):
            try:
                httpx.get(f"{url}/health", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        asyncio.run(load(url, lines[:8], 1, args))  # warm-up
        for clients in args.clients:
            batches_before = httpx.get(f"{url}/health").json()["batches"]
            result = asyncio.run(load(url, lines, clients, args))
            batches = httpx.get(f"{url}/health").json()["batches"] - batches_before
            lat = np.array(result["latencies"]) * 1000
            row = {
                "mode": "nmt serve",
                "clients": clients,
                "requests_per_s": len(lat) / result["wall_s"],
                "sentences_per_s": len(result["answers"]) / result["wall_s"],
                "p50_ms": float(np.percentile(lat, 50)),
                "p95_ms": float(np.percentile(lat, 95)),
                "p99_ms": float(np.percentile(lat, 99)),
                "sentences_per_batch": len(result["answers"]) / max(batches, 1),
                "wall_s": result["wall_s"],
                "errors": len(result["errors"]),
                **check(result["answers"], result["sent"], reference),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
        if args.screenshot:
            screenshot(url + "/", lines[:2], args.screenshot)
    finally:
        server.terminate()
        server.wait(timeout=120)

    print(
        "\n| | clients | requests/s | sentences/s | p50 ms | p95 ms | p99 ms | sentences/batch | "
        "sent | errors / lost / mismatched / swapped |"
        "\n|---|---|---|---|---|---|---|---|---|---|"
    )
    for r in rows:
        if r["mode"] == "nmt serve":
            print(
                f"| nmt serve | {r['clients']} | {r['requests_per_s']:.1f} | "
                f"{r['sentences_per_s']:.1f} | "
                f"{r['p50_ms']:.0f} | {r['p95_ms']:.0f} | {r['p99_ms']:.0f} | "
                f"{r['sentences_per_batch']:.1f} | {r['sent']} | {r['errors']} / {r['lost']} / "
                f"{r['mismatched']} / {r['swapped']} |"
            )
        else:
            rate = "n/a" if r["sentences_per_s"] is None else f"{r['sentences_per_s']:.1f}"
            print(f"| nmt translate -i FILE | | | {rate} | | | | | {len(lines)} | |")


if __name__ == "__main__":
    main()
