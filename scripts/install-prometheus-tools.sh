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
# node_exporter only to check that it reads the same --web.config.file: unpacked into a cache folder from
# Debian's package, never installed, so no service is enabled.
NODE_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/llamacpp-exporter/node-exporter"
if [[ ! -x "$NODE_DIR/usr/bin/prometheus-node-exporter" ]] && ! command -v prometheus-node-exporter >/dev/null; then
    tmp=$(mktemp -d)
    (cd "$tmp" && apt-get download -qq prometheus-node-exporter >/dev/null 2>&1) ||
        { SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"; $SUDO apt-get update -qq &&
          (cd "$tmp" && apt-get download -qq prometheus-node-exporter); }
    mkdir -p "$NODE_DIR"
    dpkg -x "$tmp"/prometheus-node-exporter_*.deb "$NODE_DIR"
    rm -rf "$tmp"
fi
promtool --version 2>&1 | head -1
