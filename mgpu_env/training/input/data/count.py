"""Counting and checking a folder of files into its cache, in a process of its own.

Run as `python -m mgpu_env.training.input.data.count kind:DIR`
(`files.load_files(in_process=False)`: a multi-worker run must not start TensorFlow's runtime
before its strategy). Exit 2 with the message on bad data."""

from __future__ import annotations

import sys

from mgpu_env.config.errors import ConfigError
from mgpu_env.config.exitcodes import EXIT_BAD_CONFIG, EXIT_OK
from mgpu_env.config.parsers import file_dataset
from mgpu_env.training.input.data.files import load_files


def main(argv: list[str]) -> int:
    found = file_dataset(argv[0]) if len(argv) == 1 else None
    if found is None:
        print("usage: python -m mgpu_env.training.input.data.count kind:DIR", file=sys.stderr)
        return EXIT_BAD_CONFIG
    kind, folder = found
    try:
        load_files(argv[0], kind, folder)  # type: ignore[arg-type]
    except ConfigError as err:
        print(err.user_message(), file=sys.stderr)
        return EXIT_BAD_CONFIG
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
