"""A CSV logger whose ``metrics.csv`` survives resuming.

Lightning's CSVLogger deletes an existing ``metrics.csv`` when a run resumes into the same
directory, losing the history a researcher plots. :class:`ResumableCSVLogger` keeps it: on its
first write it drops only the rows of the abandoned timeline (steps at or after the first step
the resumed run logs) and appends from there, so the file has no gap and no duplicated step.
"""

from __future__ import annotations

import csv
import os

from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter


class _ResumableWriter(ExperimentWriter):
    def __init__(self, log_dir: str) -> None:
        self._reconciled = False
        super().__init__(log_dir)

    def _check_log_dir_exists(self) -> None:  # the parent deletes metrics.csv here
        pass

    def save(self) -> None:
        if not self.metrics:
            return
        if not self._reconciled and os.path.isfile(self.metrics_file_path):
            first_new = min(int(m["step"]) for m in self.metrics)
            with open(self.metrics_file_path, newline="") as f:
                reader = csv.DictReader(f)
                header = list(reader.fieldnames or [])
                keep = [r for r in reader if r.get("step") not in (None, "") and int(float(r["step"])) < first_new]
            self.metrics_keys = sorted(set(self.metrics_keys) | set(header))
            tmp = self.metrics_file_path + ".tmp"
            with open(tmp, "w", newline="") as f:  # atomic: a crash here leaves the old file intact
                writer = csv.DictWriter(f, fieldnames=self.metrics_keys)
                writer.writeheader()
                writer.writerows(keep)
            os.replace(tmp, self.metrics_file_path)
        self._reconciled = True
        super().save()


class ResumableCSVLogger(CSVLogger):
    """``lightning.pytorch.loggers.CSVLogger`` that appends to, rather than deletes, an earlier
    run's ``metrics.csv`` when resuming into the same directory."""

    @property
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _ResumableWriter(log_dir=self.log_dir)
        return self._experiment
