"""How many CPUs this process may use: the affinity mask, capped by the cgroup CPU quota.

``os.cpu_count()`` counts the host's CPUs; a job pinned to some of them (``taskset``,
Slurm, Kubernetes cpusets) or throttled by a CPU quota (Docker ``--cpus``, Kubernetes
limits) may use fewer, and more compile workers than that only contend. The quota is read
from cgroup v2 (``cpu.max``: ``"<quota> <period>"`` or ``"max <period>"``) or cgroup v1
(``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, quota ``-1`` = none), for this process's
cgroup and each ancestor up to the mount point; the smallest limit wins, rounded down (at
least 1): compiles are CPU-bound, so a fraction of a CPU buys no worker.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

__all__ = ["available_cpus", "cgroup_cpu_limit"]


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _ancestors(root: Path, rel: str) -> list[Path]:
    """``root/rel`` and its parents up to ``root`` (the cgroup mount)."""
    parts = [p for p in rel.split("/") if p and p != ".."]
    return [root.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]


def _v2_limit(root: Path, rel: str) -> float | None:
    limits = []
    for directory in _ancestors(root, rel):
        text = _read(directory / "cpu.max")
        if not text:
            continue
        fields = text.split()
        if len(fields) == 2 and fields[0] != "max":
            try:
                quota, period = int(fields[0]), int(fields[1])
            except ValueError:
                continue
            if quota > 0 and period > 0:
                limits.append(quota / period)
    return min(limits) if limits else None


def _v1_limit(root: Path, rel: str) -> float | None:
    limits = []
    for directory in _ancestors(root, rel):
        quota, period = (
            _read(directory / "cpu.cfs_quota_us"),
            _read(directory / "cpu.cfs_period_us"),
        )
        try:
            q, p = int(quota or ""), int(period or "")
        except ValueError:
            continue
        if q > 0 and p > 0:
            limits.append(q / p)
    return min(limits) if limits else None


def cgroup_cpu_limit(
    proc_cgroup: str | os.PathLike[str] = "/proc/self/cgroup",
    cgroup_root: str | os.PathLike[str] = "/sys/fs/cgroup",
) -> float | None:
    """The CPU quota of this process's cgroup in CPUs (e.g. ``1.5``), or ``None`` if unlimited
    or unknown. The paths are parameters for tests."""
    text = _read(Path(proc_cgroup))
    if text is None:
        return None
    root = Path(cgroup_root)
    limits = []
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, rel = rest.partition(":")
        if hierarchy == "0" and controllers == "":  # cgroup v2 (unified)
            found = _v2_limit(root, rel)  # ends at the mount root: a container's own cgroup
            if found is None and (root / "unified").is_dir():  # hybrid layout
                found = _v2_limit(root / "unified", rel)
        elif "cpu" in controllers.split(","):
            base = next(
                (root / n for n in (controllers, "cpu,cpuacct", "cpu") if (root / n).is_dir()),
                None,
            )
            found = None if base is None else _v1_limit(base, rel)
        else:
            continue
        if found is not None:
            limits.append(found)
    return min(limits) if limits else None


def available_cpus() -> int:
    """CPUs this process may use: its affinity mask, capped by the cgroup CPU quota (>= 1)."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        count = os.cpu_count() or 1
    limit = cgroup_cpu_limit()
    if limit is not None:
        count = min(count, max(1, math.floor(limit)))
    return max(1, count)
