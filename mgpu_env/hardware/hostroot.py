"""Where every probe reads the machine: `/`, or the folder `MGPU_HOST_ROOT` names.

Each probe of `/proc`, `/sys`, `/dev`, `/etc` and `/run` builds its path with `host_path`, so
that the same probe reads a test's fake machine (a folder holding that tree) exactly as it reads
the real one, and a container that mounts the host's root at, say, `/host` can point the doctor
at it (as node-exporter's `--path.rootfs` does). The value is untrusted input: a root that is not
a readable folder is refused by `host_root` with the value and the fix, never silently `/`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from mgpu_env.config.errors import ConfigError

ENV_VAR = "MGPU_HOST_ROOT"


class HostRootError(ConfigError, ValueError):
    """MGPU_HOST_ROOT names something that is not a folder this process can read (a bad
    setting: exit 2)."""


def host_root(environ: Mapping[str, str] | None = None) -> Path:
    """The root the probes read: `/` unless MGPU_HOST_ROOT names a readable folder."""
    value = (os.environ if environ is None else environ).get(ENV_VAR, "")
    if not value:
        return Path("/")
    root = Path(value)
    if not root.is_absolute() or not root.is_dir() or not os.access(root, os.R_OK | os.X_OK):
        raise HostRootError(
            f"{ENV_VAR}={value[:200]!r} is not an absolute path to a readable folder; it names "
            f"the root the doctor reads /proc, /sys and /dev under (a host mounted at /host: "
            f"{ENV_VAR}=/host); unset it to read this machine's own")
    return root


def host_path(path: str, environ: Mapping[str, str] | None = None) -> Path:
    """`path` (absolute, as on the machine: "/proc/self/limits") under the probes' root."""
    if not path.startswith("/"):
        raise ValueError(f"host_path takes an absolute machine path, got {path!r}")
    return host_root(environ) / path.lstrip("/")
