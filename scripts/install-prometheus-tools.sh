#!/usr/bin/env bash
# Install Prometheus, promtool, Alertmanager/amtool and mtail from Debian's packages (no daemon starts).
set -euo pipefail
need=()
command -v promtool >/dev/null || need+=(prometheus)
command -v prometheus-alertmanager >/dev/null || need+=(prometheus-alertmanager)
command -v mtail >/dev/null || need+=(mtail)
if ((${#need[@]})); then
    SUDO=""
    [[ $(id -u) -ne 0 ]] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
promtool --version 2>&1 | head -1
