"""Model fields name a local folder or a Hugging Face Hub id (``Qwen/Qwen2.5-Omni-7B``, optionally
``@revision``); an id resolves to its snapshot folder in the HF cache, so every loader below reads a
plain folder. ``HF_HUB_OFFLINE=1`` reads the cache only and says which id and cache folder are missing.
"""

from __future__ import annotations

import os
import re

#: ``org/name`` or ``org/name@revision``: one slash, the Hub's characters. Anything else is a path.
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?$")


class MissingWeightsError(FileNotFoundError):
    """A model field names weights this machine does not have (no folder, no cached Hub snapshot)."""


def is_hub_id(value: object) -> bool:
    """True for ``org/name`` (``@rev``) that is not an existing path: a folder always wins."""
    return isinstance(value, str) and bool(HUB_ID.match(value)) and not os.path.exists(value)


def hub_cache() -> str:
    """The cache folder ``snapshot_download`` uses; read at call time, so HF_HUB_CACHE set late counts."""
    from huggingface_hub import constants

    return os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` as huggingface_hub reads it, but at call time (it reads it once at import)."""
    from huggingface_hub import constants

    flag = os.environ.get("HF_HUB_OFFLINE")
    return constants.HF_HUB_OFFLINE if flag is None else flag.strip().upper() in ("1", "ON", "YES", "TRUE")


def hub_unreachable() -> str | None:
    """Why the Hub cannot be reached, when its host does not even resolve (a machine without network):
    huggingface_hub would retry the download for about 20 s before giving up; a DNS lookup says so
    in milliseconds. None when the host resolves (the download is tried, and may still fail)."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    host = urlparse(os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).hostname
    if not host:
        return None
    try:
        socket.getaddrinfo(host, 443)
    except OSError as err:
        return f"{host} does not resolve ({err.strerror or err}): only the cache was read"
    return None


def resolve_model(name_or_path: str | None, where: str, file: str | None = None) -> str | None:
    """The local folder a model field names: a folder as is; a Hub id's cached snapshot (downloaded
    first unless offline). ``file``: fetch only that file of the repo (``agentcap plan`` needs
    ``config.json`` alone). Anything that is neither a folder nor an id comes back unchanged, for the
    caller's own "not found" message. A leading ``~`` is the home folder (``~/.cache/agentcap/…``)."""
    if isinstance(name_or_path, str) and name_or_path.startswith("~"):
        name_or_path = os.path.expanduser(name_or_path)
    if name_or_path is None or not is_hub_id(name_or_path):
        return name_or_path
    from huggingface_hub import hf_hub_download, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    repo, _, revision = name_or_path.partition("@")
    cache, offline = hub_cache(), hub_offline()
    unreachable = None if offline else hub_unreachable()
    options = {"revision": revision or None, "cache_dir": cache, "local_files_only": offline or bool(unreachable)}
    try:
        if file is not None:
            return os.path.dirname(hf_hub_download(repo, file, **options))
        return snapshot_download(repo, **options)
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError, ValueError) as err:
        how = ("HF_HUB_OFFLINE=1: only the cache is read" if offline else unreachable
               or f"download failed: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
        raise MissingWeightsError(
            f"{where}: {name_or_path!r} is not a local folder and the Hub id has no snapshot in the HF cache "
            f"{cache} ({how}). Download it on a machine with network (`hf download {repo}`, same "
            "HF_HUB_CACHE), or give a local folder."
        ) from None
