"""Fetch one source distribution from the package index pip uses, check its pinned sha256, and save it.

`python scripts/sdist.py NAME VERSION SHA256 DIR` prints the saved file's path. Only the archive is fetched:
nothing in it is built or run (pip would build the package's metadata, with its build backend's newest,
unpinned releases, to hand over an sdist; llama.cpp's converter needs three folders out of it). The index is
the one pip is configured with (PIP_INDEX_URL, pip's `global.index-url`, else pip's default), read through its
JSON simple API (PEP 691); a file whose digest is not the pinned one is removed and refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

CHUNK = 1 << 20


def index_url() -> str:
    url = os.environ.get("PIP_INDEX_URL")
    if not url:
        said = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.index-url"],
                              capture_output=True, text=True)
        url = said.stdout.strip() if said.returncode == 0 else ""
    if not url:
        from pip._internal.models.index import PyPI  # pip's own default index

        url = PyPI.simple_url
    return url.rstrip("/") + "/"


def fetch(name: str, version: str, sha256: str, folder: Path) -> Path:
    project = re.sub(r"[-_.]+", "-", name).lower()
    request = urllib.request.Request(f"{index_url()}{project}/",
                                     headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        files = json.load(reply)["files"]
    wanted = f"{project.replace('-', '_')}-{version}.tar.gz"
    found = [f for f in files if f["filename"].lower() == wanted]
    if not found:
        raise SystemExit(f"error: {wanted} is not on the index {index_url()}")
    url = str(found[0].get("url", ""))
    if urllib.parse.urlsplit(url).scheme not in ("https", "http"):  # the index names where; only the web is fetched
        raise SystemExit(f"error: the index names {wanted} at a URL that is not http(s): refused")
    target = folder / found[0]["filename"]
    digest = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=600) as reply, target.open("wb") as out:
        for chunk in iter(lambda: reply.read(CHUNK), b""):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != sha256:
        target.unlink()
        raise SystemExit(f"error: {wanted} has sha256 {digest.hexdigest()}, not the pinned {sha256}: refused")
    return target


if __name__ == "__main__":
    if len(sys.argv) != 5:
        raise SystemExit("usage: python scripts/sdist.py NAME VERSION SHA256 DIR")
    print(fetch(sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])))
