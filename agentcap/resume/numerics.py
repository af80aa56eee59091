"""What a run's floats depend on besides its config and seed, kept beside ``config.yaml``.

The same seed and config give the same figures only on the same numerics: the torch thread count
(on the real audio LM, 1 and 2 threads give different bits: ATen's reductions and MKL's kernels split
their sums by thread), the CPU kernels that the environment pins (ATen's capability, MKL's CBWR
branch, oneDNN's ISA), the CPU itself and the library versions. ``fit`` appends them to
``<run_dir>/numerics.json`` at every start, and a resume on other numerics says which changed, so a
figure that does not repeat can be traced to its cause instead of guessed at (docs/real.md).
"""

from __future__ import annotations

import json
import os
import platform
import time
from typing import Any, Callable

NAME = "numerics.json"
#: environment variables that choose CPU kernels or their thread count
PINNED = ("OMP_NUM_THREADS", "ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA")
#: the fields two starts of one run are compared on (``started`` and ``host`` may differ freely)
COMPARED = ("torch_threads", "cpu_capability", "env", "cpu", "torch", "transformers", "device")
#: CPU features that choose among MKL's, oneDNN's and ATen's kernels (the flags of ``/proc/cpuinfo``)
KERNEL_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile")


def current() -> dict[str, Any]:
    """This process's numerics, as ``numerics.json`` records them (torch imported here: ``plan`` stays light)."""
    import torch
    import transformers

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    return {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": platform.node(),
        "torch_threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "env": {name: os.environ.get(name) for name in PINNED},
        "cpu": cpu_model(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": device,
    }


def cpu_model() -> str:
    """The CPU as kernels see it: model name, vendor and the kernel-choosing flags it has
    (``Intel(R) Xeon(R) Processor [GenuineIntel; avx2 fma avx512f …]``); ``platform`` where there is
    no ``/proc/cpuinfo``. Two machines of one kind may differ here (an AMD EPYC and an Intel Xeon)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if not line.strip():
                    break  # the first processor's block is enough
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    if "model name" not in fields:
        return platform.processor() or platform.machine()
    flags = set(fields.get("flags", "").split())
    present = " ".join(flag for flag in KERNEL_FLAGS if flag in flags)
    return f"{fields['model name']} [{fields.get('vendor_id', '?')}; {present}]"


def differences(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """``field: old → new`` for every compared field that changed (nested ``env`` by variable)."""
    changed = []
    for field in COMPARED:
        old, new = before.get(field), now.get(field)
        if field == "env" and isinstance(old, dict) and isinstance(new, dict):
            changed += [f"{name}: {old.get(name)} → {new.get(name)}"
                        for name in sorted(set(old) | set(new)) if old.get(name) != new.get(name)]
        elif old != new:
            changed.append(f"{field}: {old} → {new}")
    return changed


def record(run_dir: str, report: Callable[[str], None] | None = None,
           numerics: dict[str, Any] | None = None) -> list[str]:
    """Append this start's numerics to ``<run_dir>/numerics.json``; report and return what changed
    since the run's last start. An unreadable file is set aside as ``numerics.json.bad``, not lost."""
    report = report or print
    now = numerics if numerics is not None else current()
    path = os.path.join(run_dir, NAME)
    starts: list[dict[str, Any]] = []
    if os.path.exists(path):
        try:
            starts = _read(path)
        except (OSError, ValueError) as err:
            os.replace(path, path + ".bad")
            report(f"agentcap: {path} is unreadable ({err}); kept as {NAME}.bad, a new record started")
            starts = []
    changed = differences(starts[-1], now) if starts else []
    if changed:
        report(f"agentcap: {run_dir} continues on other numerics than its last start ({'; '.join(changed)}): "
               "its figures will not repeat an uninterrupted run's to the last digit")
    os.makedirs(run_dir, exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(starts + [now], handle, indent=1)
        handle.write("\n")
    os.replace(path + ".tmp", path)
    return changed


def _read(path: str) -> list[dict[str, Any]]:
    """The starts a ``numerics.json`` holds; ValueError (JSONDecodeError among them) when it is not a list of objects."""
    with open(path, encoding="utf-8") as handle:
        starts = json.load(handle)
    if not isinstance(starts, list) or not all(isinstance(s, dict) for s in starts):
        raise ValueError(f"expected a list of objects, got {type(starts).__name__}")
    return starts


def first_start(run_dir: str) -> dict[str, Any] | None:
    """The numerics a run started on; None for a run from before ``numerics.json`` or an unreadable record."""
    try:
        starts = _read(os.path.join(run_dir, NAME))
    except (OSError, ValueError):
        return None
    return starts[0] if starts else None


def describe(start: dict[str, Any]) -> str:
    """One line of the compared fields: ``1 torch thread, <cpu>, MKL_CBWR=AVX2 …, torch …``."""
    threads = start.get("torch_threads")
    env = start.get("env") or {}
    pins = " ".join(f"{name}={env[name]}" for name in PINNED if env.get(name) is not None)
    parts = [f"{threads} torch thread{'' if threads == 1 else 's'}", str(start.get("cpu")),
             f"ATen {start.get('cpu_capability')}", pins or "no pinning variables",
             f"torch {start.get('torch')}", f"transformers {start.get('transformers')}", str(start.get("device"))]
    return ", ".join(parts)
