"""The run log: ``log.jsonl``, one JSON record per line, its only writer and reader.

Records are either training statistics (``{"step": ..., "e_diff": ..., ...}``, every
``log_every`` steps) or events (``{"event": "fault" | "rolled_back" | "config_changed", ...}``).
A resume or a rollback truncates the log to the step it returns to, so no step is logged twice.
A torn final line (a kill or a full disk during a write) is dropped when reading, with a warning.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from composable_ebm.errors import ModelFileError

LOG_NAME = "log.jsonl"


def read_log(path: str | Path) -> list[dict[str, Any]]:
    """Records of a ``log.jsonl`` (a run folder or the file itself)."""
    path = Path(path)
    if path.is_dir():
        path = path / LOG_NAME
    if not path.is_file():
        raise FileNotFoundError(f"no training log at {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ModelFileError(f"{path}: not UTF-8 text (byte {err.start}); a training log is JSON lines") from err
    lines = [line for line in text.splitlines() if line.strip()]
    records = []
    for i, line in enumerate(lines):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if i == len(lines) - 1:  # the last write was cut short; everything before it is intact
                warnings.warn(f"{path}: dropped a torn last line ({err.msg})", stacklevel=2)
                break
            raise ModelFileError(f"{path}, line {i + 1}: not a JSON record ({err.msg}); remove the line") from err
        if not isinstance(record, dict) or not isinstance(record.get("step", record.get("to_step", 0)), int):
            raise ModelFileError(f"{path}, line {i + 1}: not a log record (a JSON object with an integer step),"
                                 f" got {line.strip()[:60]!r}; remove the line")
        records.append(record)
    return records


class RunLog:
    """Appends records to ``folder/log.jsonl`` (and scalars to TensorBoard when it is installed)."""

    def __init__(self, folder: Path, tensorboard: bool = True) -> None:
        self.path = folder / LOG_NAME
        self._writer = None
        if tensorboard:
            import importlib.util

            if importlib.util.find_spec("tensorboard") is not None:
                from torch.utils.tensorboard import SummaryWriter

                self._writer = SummaryWriter(str(folder / "tensorboard"))

    def append(self, record: dict[str, Any]) -> None:
        """Append one record (and its scalars to TensorBoard when installed)."""
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self._writer is not None and "event" not in record:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    self._writer.add_scalar(key, value, record["step"])

    def truncate(self, step: int) -> None:
        """Drop records written after ``step`` (they will be redone)."""
        if not self.path.is_file():
            return
        kept = [r for r in read_log(self.path) if r.get("step", r.get("to_step", 0)) <= step]
        self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))
