"""Build every shipped task in a temporary folder and print the base commit each one hashes to."""

import dataclasses
import tempfile
from pathlib import Path

from . import task_sources
from .source import build_repo

with tempfile.TemporaryDirectory() as tmp:
    for source in task_sources():
        head = build_repo(dataclasses.replace(source, base_commit=""), Path(tmp) / source.name)
        status = "ok" if head == source.base_commit else f"recorded {source.base_commit or '(none)'}"
        print(f"{source.name:12s} {head}  {status}")
