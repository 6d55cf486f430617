"""The study's results JSON (`Results`), and the atomic JSON write every record of a study goes through."""

from __future__ import annotations

import json
import os
from pathlib import Path


class Results:
    """The study's results JSON, rewritten (atomically) after every stage so that a stopped study resumes."""

    def __init__(self, path: Path, study: str):
        self.path = path
        self.data = json.loads(path.read_text()) if path.exists() else {}
        self.data.setdefault("study", study)
        self.data.setdefault("sft", {})
        self.data.setdefault("runs", {})

    def save(self) -> None:
        if int(os.environ.get("RANK", "0")) != 0:  # under `accelerate launch`, the main process writes
            return
        write_json(self.path, self.data)


def write_json(path: Path, data: dict) -> None:
    """Write `data` to `path` atomically (a reader sees the old file or the new one, never half of one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True, default=str))
    tmp.replace(path)
