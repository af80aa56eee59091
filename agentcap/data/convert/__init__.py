"""Adapters from public dataset releases to agentcap manifests (``agentcap data convert --from NAME``).

One module per family: :mod:`.captions` (AudioCaps, Clotho, WavCaps → caption manifests that
``agentcap data bank`` turns into cloze banks), :mod:`.benchmarks` (MMAU, MMAR, MMSU → the benchmark
manifest of ``agentcap evaluate --benchmark``), :mod:`.movies` (MAD, CMD-AD, TV-AD → ADClip
manifests with per-clip feature files). Every adapter is ``function(sources, Options) -> Result``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from agentcap.data.convert.common import Options, Result

#: --from NAME → "module:function" (imported when used: the movie adapters need numpy only, the
#: audio ones soundfile).
ADAPTERS: dict[str, str] = {
    "audiocaps": "agentcap.data.convert.captions:audiocaps",
    "clotho": "agentcap.data.convert.captions:clotho",
    "wavcaps": "agentcap.data.convert.captions:wavcaps",
    "mmau": "agentcap.data.convert.benchmarks:mmau",
    "mmar": "agentcap.data.convert.benchmarks:mmar",
    "mmsu": "agentcap.data.convert.benchmarks:mmsu",
    "mad": "agentcap.data.convert.movies:mad",
    "cmdad": "agentcap.data.convert.movies:cmdad",
    "tvad": "agentcap.data.convert.movies:tvad",
}


def adapter(name: str) -> Callable[[list[str], Options], Result]:
    if name not in ADAPTERS:
        raise ValueError(f"--from: unknown format {name!r}; known: {', '.join(ADAPTERS)}")
    module, function = ADAPTERS[name].split(":")
    return getattr(importlib.import_module(module), function)


__all__ = ["ADAPTERS", "Options", "Result", "adapter"]
