#!/usr/bin/env bash
# The tests that need systemd's own programs and root (pytest -m system): a private, namespaced
# systemd-journald fed by systemd-cat, journalctl reading it, `systemd-analyze verify` on the units.
#
# Needs root: a private journald listens under /run/systemd. Where systemd's programs are missing
# (a container), installs Debian's systemd package, which starts nothing there; a host that runs
# systemd has them already. Nothing is enabled, and the private journald is stopped afterwards.
# Extra arguments go to pytest.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
say() { echo "test-system: $*" >&2; }

[[ $(id -u) -eq 0 ]] || { say "needs root (a private systemd-journald): run 'sudo make test-system'"; exit 1; }

scripts/bootstrap.sh

journald=""
for j in /lib/systemd/systemd-journald /usr/lib/systemd/systemd-journald; do
    [[ -x "$j" ]] && journald="$j"
done
if [[ -z "$journald" ]] || ! command -v journalctl >/dev/null || ! command -v systemd-analyze >/dev/null; then
    command -v apt-get >/dev/null || { say "systemd-journald, journalctl or systemd-analyze missing: install systemd"; exit 1; }
    say "installing Debian's systemd package (journald, journalctl, systemd-analyze)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends systemd >&2
fi

exec .venv/bin/python -m pytest -p no:cacheprovider -m system "$@"
