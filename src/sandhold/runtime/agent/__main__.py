"""Entry point of the in-sandbox agent.

Started as ``/usr/bin/python3 -I -S /opt/sandhold/lib/sandhold/runtime/agent/__main__.py
--config /run/sandhold/agent.json``: isolated mode, no site-packages, so the directory four
levels up (which holds the ``sandhold`` and ``h11`` packages) goes on sys.path first.
"""

import os
import sys


def _bootstrap() -> None:
    lib = os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    )
    if lib not in sys.path:
        sys.path.insert(0, lib)
    # asyncio imports ssl if it can, which maps OpenSSL (~2.5 MiB per agent); it works without
    # it, and nothing here speaks TLS.
    sys.modules.setdefault("ssl", None)  # type: ignore[arg-type]
    # Descriptors 0-2 must exist, or a new pipe could land on them and be clobbered by dup2.
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)


def _parse(argv: list[str]) -> str:
    if len(argv) == 2 and argv[0] == "--config":
        return argv[1]
    if len(argv) == 1 and argv[0].startswith("--config="):
        return argv[0].split("=", 1)[1]
    sys.stderr.write("usage: __main__.py --config FILE\n")
    raise SystemExit(2)


if __name__ == "__main__":
    _bootstrap()
    config_path = _parse(sys.argv[1:])
    from sandhold.runtime.agent.server import main

    raise SystemExit(main(config_path))
