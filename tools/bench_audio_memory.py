"""Peak memory of loading a long audio file with ``max_seconds``: only the kept part is decoded.

Why: ``load_audio`` used to decode the whole file before cutting it at ``max_seconds``; a 2 GB
WAV took 8.7 GB of RAM (a 200 MB one 1.7 GB) to keep 30 s (issue 26). This builds sparse WAVs
(a valid header claiming N bytes of 16-bit samples, the file ``truncate``-d to that size, so it
costs no disk), loads each in a fresh process and reports the process's peak RSS above what it
held before the call (``ru_maxrss``), next to the bytes kept (float32 at the target rate).

    python tools/bench_audio_memory.py                          # 2 GB and 200 MB, max_seconds=30
    python tools/bench_audio_memory.py --sizes 50M --max-seconds 10
    python tools/bench_audio_memory.py --smoke                  # one 2 MB file (CI)
    python tools/bench_audio_memory.py --worker load --path x.wav --max-seconds 30   # one process
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import struct
import subprocess
import sys
import tempfile
import time

#: The issue's figures before the fix (peak RSS of ``load_audio(..., max_seconds=30)``), by file size.
BEFORE_FIX = {2_000_000_000: 8.7e9, 200_000_000: 1.7e9}
UNITS = {"K": 10**3, "M": 10**6, "G": 10**9}


def sparse_wav(path: str, size: int, rate: int = 16000, channels: int = 1) -> str:
    """A ``size``-byte 16-bit PCM WAV of silence that takes no disk space (the samples are a hole)."""
    data = (size - 44) // (2 * channels) * 2 * channels
    header = b"RIFF" + struct.pack("<I", 36 + data) + b"WAVE"
    header += b"fmt " + struct.pack("<IHHIIHH", 16, 1, channels, rate, rate * channels * 2, channels * 2, 16)
    header += b"data" + struct.pack("<I", data)
    with open(path, "wb") as handle:
        handle.write(header)
        handle.truncate(44 + data)
    return path


def peak_rss_bytes() -> int:
    """This process's peak resident set so far (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def worker(kind: str, path: str, sample_rate: int, max_seconds: float | None) -> dict:
    """Load (or check) ``path`` once in this process; the peak RSS it added and the time it took."""
    import soundfile  # noqa: F401  (imported before the baseline: their code is not the call's memory)
    import torchaudio.functional  # noqa: F401

    from agentcap.core.manifests import check_audio, load_audio

    before = peak_rss_bytes()
    start = time.perf_counter()
    if kind == "load":
        kept = load_audio(path, sample_rate, where=path, max_seconds=max_seconds).nbytes
    else:
        duration = check_audio({"audio": path}, "audio", path, max_seconds=max_seconds)
        kept = int(min(duration, max_seconds or duration) * sample_rate) * 4  # what load_audio will keep
    peak = peak_rss_bytes()
    return {"peak": peak, "peak_increase": peak - before, "seconds": time.perf_counter() - start, "kept_bytes": kept}


def measure(kind: str, path: str, sample_rate: int, max_seconds: float | None) -> dict:
    """``worker`` in a fresh interpreter, so each figure is that one call's peak and nothing else's."""
    command = [sys.executable, __file__, "--worker", kind, "--path", path, "--sample-rate", str(sample_rate)]
    if max_seconds is not None:
        command += ["--max-seconds", str(max_seconds)]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def size_bytes(text: str) -> int:
    text = text.strip().upper()
    return int(float(text[:-1]) * UNITS[text[-1]]) if text[-1] in UNITS else int(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="2G,200M", help="sparse WAV sizes, e.g. 2G,200M,50M")
    parser.add_argument("--max-seconds", type=float, default=30.0)
    parser.add_argument("--sample-rate", type=int, default=16000, help="the rate the env asks for")
    parser.add_argument("--file-rate", type=int, default=16000, help="the WAV's own rate (differs: resampled)")
    parser.add_argument("--dir", default=None, help="where the sparse files go (default: a temporary folder)")
    parser.add_argument("--smoke", action="store_true", help="one 2 MB file, max_seconds=1 (CI)")
    parser.add_argument("--worker", choices=["load", "check"], help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        args.sizes, args.max_seconds = "2M", 1.0
    if args.worker:
        print(json.dumps(worker(args.worker, args.path, args.sample_rate, args.max_seconds)))
        return

    import soundfile

    MB = 1e6
    print(f"max_seconds={args.max_seconds}, file rate {args.file_rate} Hz, target rate {args.sample_rate} Hz")
    print("peak: the process's peak RSS; +: above its peak before the call; before fix: the issue's peak RSS")
    print(f"{'file':>8} {'header':>9} {'call':>6} {'kept MB':>8} {'peak MB':>8} {'+MB':>6} {'+/kept':>7} "
          f"{'before fix':>11} {'s':>6}")
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        for size in map(size_bytes, args.sizes.split(",")):
            path = sparse_wav(os.path.join(folder, f"sparse_{size}.wav"), size, rate=args.file_rate)
            info = soundfile.info(path)  # soundfile must read the sparse file like any other WAV
            assert info.frames == (size - 44) // 2, (path, info)
            for kind in ("load", "check"):
                row = measure(kind, path, args.sample_rate, args.max_seconds)
                before = BEFORE_FIX.get(size) if kind == "load" and args.max_seconds == 30.0 else None
                print(
                    f"{size / MB:>6.0f}MB {info.duration / 3600:>7.2f} h {kind:>6} {row['kept_bytes'] / MB:>8.2f} "
                    f"{row['peak'] / MB:>8.0f} {row['peak_increase'] / MB:>6.1f} "
                    f"{row['peak_increase'] / max(row['kept_bytes'], 1):>7.1f} "
                    f"{f'{before / MB:.0f} MB' if before else '-':>11} {row['seconds']:>6.2f}"
                )
            os.remove(path)


if __name__ == "__main__":
    main()
