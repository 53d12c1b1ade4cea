"""`python -m exporter.web.healthcheck`: exit 0 when the exporter in this container answers `/healthz`.

The container image's HEALTHCHECK. It reads the port from `LLAMACPP_EXPORTER_LISTEN_ADDRESS` (the
image's way to change it; a `--listen-address` flag is not visible here) and asks 127.0.0.1, so it
works whatever address the exporter binds. Only the standard library: it runs every 30 s.

    $ python -m exporter.web.healthcheck; echo $?
    0
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

from exporter.config import DEFAULT_PORT, ENV_PREFIX


def main() -> int:
    """Return 0 if GET /healthz answers 200 within 4 s, else 1 (with the reason on stderr)."""
    address = os.environ.get(ENV_PREFIX + "LISTEN_ADDRESS", f"0.0.0.0:{DEFAULT_PORT}")
    port = address.rpartition(":")[2] or str(DEFAULT_PORT)
    url = f"http://127.0.0.1:{port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=4) as resp:
            status = int(resp.status)
    except (OSError, urllib.error.URLError) as exc:
        print(f"healthcheck: {url}: {exc}", file=sys.stderr)
        return 1
    if status != 200:
        print(f"healthcheck: {url}: HTTP {status}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
