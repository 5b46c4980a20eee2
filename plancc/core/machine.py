"""What this machine lets plancc use, read when a bound must fit it: the CPUs this process may run on, and the
memory it can still allocate (free memory, the container's limit, the address-space limit of `ulimit -v`)."""

from __future__ import annotations

import os
import resource
from pathlib import Path

# a container's memory limit and use: cgroup v2, else v1
_CGROUPS = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
            ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"))


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity: a container or `taskset` gives fewer than the machine has)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _meminfo(*keys: str) -> int | None:
    """The sum of /proc/meminfo's `keys`, in bytes (None where there is no /proc)."""
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return None
    values = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in lines if line.split()[1:2]}
    return sum(values.get(k, 0) for k in keys) if keys[0] in values else None


def _cgroup_room() -> int | None:
    """What the container's memory limit leaves (None: no limit)."""
    for limit_file, usage_file in _CGROUPS:
        try:
            limit, usage = Path(limit_file).read_text().strip(), Path(usage_file).read_text().strip()
        except OSError:
            continue
        if limit.isdigit() and int(limit) < 2**60:  # "max", or v1's page-rounded 2**63: no limit
            return max(0, int(limit) - int(usage))
        return None
    return None


def address_room() -> int | None:
    """What `ulimit -v` (RLIMIT_AS) leaves this process beyond what it maps now (None: no limit)."""
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    if soft == resource.RLIM_INFINITY:
        return None
    return max(0, soft - (mapped_bytes() or 0))


def _status_bytes(key: str) -> int | None:
    """A byte count of /proc/self/status (VmSize: address space mapped), None where unknown."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def available_memory() -> int | None:
    """Bytes this process can still allocate, the least of what the kernel has free (MemAvailable and free swap),
    what the container's limit leaves and what `ulimit -v` leaves; None where none of them is known."""
    known = [room for room in (_meminfo("MemAvailable", "SwapFree"), _cgroup_room(), address_room())
             if room is not None]
    return min(known) if known else None


def mapped_bytes() -> int | None:
    """The address space this process maps now (VmSize), None where unknown."""
    return _status_bytes("VmSize")
