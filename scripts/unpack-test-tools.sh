#!/usr/bin/env bash
# Unpack the test tools from Debian's packages into a cache folder: nothing is installed, no service
# is enabled or started, no root is needed (unless apt's package lists were never fetched).
#
#   prometheus, promtool            (prometheus)
#   prometheus-alertmanager, amtool (prometheus-alertmanager)
#   mtail                           (mtail; the bench's comparison)
#   prometheus-node-exporter        (prometheus-node-exporter; reads the same --web.config.file)
#   docker-compose 1.29.2           (docker-compose and its python3-* packages, run by /usr/bin/python3)
#   chromium, headless, chromedriver (chromium, chromium-driver of the same version, and those of
#                                    their libraries this host lacks; the tests that open `diagnose
#                                    --html` pages and the status page in a real browser, the latter
#                                    driven by selenium through chromedriver)
#
# Each package is fetched with `apt-get download` and unpacked with `dpkg -x` into
# $TOOLS/root (chromium's into $TOOLS/chromium); $TOOLS/bin holds one link (or, for docker-compose,
# chromium and chromedriver, a wrapper) per tool.
# tests/conftest.py puts $TOOLS/bin first on PATH. Safe to run again: skipped when done.
#
# Env: LLAMACPP_EXPORTER_TOOLS (default ${XDG_CACHE_HOME:-~/.cache}/llamacpp-exporter/tools).
set -euo pipefail

TOOLS="${LLAMACPP_EXPORTER_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/llamacpp-exporter/tools}"
say() { echo "unpack-test-tools: $*" >&2; }
die() { say "$*"; exit 1; }

GO_TOOLS=(prometheus prometheus-alertmanager mtail prometheus-node-exporter)
# docker-compose 1.29.2 is Python: its own package and the python3-* packages it imports, so that it
# runs whether or not the host has them. `apt-cache depends --recurse docker-compose` lists these.
COMPOSE=(docker-compose python3-attr python3-cached-property python3-certifi python3-chardet
    python3-charset-normalizer python3-distro python3-distutils python3-docker python3-dockerpty
    python3-docopt python3-dotenv python3-idna python3-importlib-metadata python3-jsonschema
    python3-more-itertools python3-pkg-resources python3-pyrsistent python3-requests python3-six
    python3-texttable python3-typing-extensions python3-urllib3 python3-websocket python3-yaml
    python3-zipp)
PACKAGES=("${GO_TOOLS[@]}" "${COMPOSE[@]}")
stamp="$TOOLS/.unpacked"
want="$(printf '%s\n' "${PACKAGES[@]}" | sha256sum | cut -d' ' -f1)"

tmp=""
trap 'rm -rf "${tmp:-}"' EXIT
need_apt() {
    command -v apt-get >/dev/null && command -v dpkg >/dev/null ||
        die "needs apt-get and dpkg (Debian or Ubuntu); elsewhere put promtool, prometheus, amtool, prometheus-alertmanager, mtail, docker-compose, chromium and chromedriver on PATH"
}
# apt_update WHY: fetch apt's package lists (a fresh machine, a container, may never have).
apt_update() {
    local sudo=""
    if [[ $(id -u) -ne 0 ]]; then
        sudo -n true 2>/dev/null || die "$1 (run 'sudo apt-get update' once, then again)"
        sudo="sudo -n"
    fi
    say "fetching apt's package lists (apt-get update)"
    $sudo apt-get update -qq >&2
}
# download DIR PACKAGE...: the packages' .deb files into DIR (a new temporary folder).
download() {
    local dir="$1"
    shift
    chmod 755 "$dir" # apt-get download writes as _apt when run as root
    if ! (cd "$dir" && apt-get download -qq "$@" >/dev/null 2>"$dir/apt.err"); then
        apt_update "apt-get download failed: $(tail -1 "$dir/apt.err")"
        rm -f "$dir"/*.deb
        (cd "$dir" && apt-get download -qq "$@" >/dev/null) || die "apt-get download failed"
    fi
}

if [[ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]]; then
    need_apt
    tmp="$(mktemp -d)"
    say "downloading ${#PACKAGES[@]} Debian packages into $TOOLS (≈40 MB, ≈170 MB unpacked; nothing is installed)"
    download "$tmp" "${PACKAGES[@]}"
    rm -rf "$TOOLS"
    mkdir -p "$TOOLS/root" "$TOOLS/bin"
    for deb in "$tmp"/*.deb; do
        dpkg -x "$deb" "$TOOLS/root"
    done
    # Debian's Alertmanager reads its default notification template from /usr/share/prometheus/
    # alertmanager, which an unpacked package does not fill. The path is a string constant in the
    # (Go) binary: it becomes the relative path "alertmanager-assets" of the same length, and
    # tests/support/prom_harness.py links that name, in Alertmanager's working folder, to the unpacked files.
    python3 - "$TOOLS/root/usr/bin/prometheus-alertmanager" <<'PY' || die "cannot point Alertmanager at its unpacked templates"
import sys
path, old = sys.argv[1], b"/usr/share/prometheus/alertmanager"
new = b"alertmanager-assets".ljust(len(old), b"/")
data = open(path, "rb").read()
if old not in data:
    sys.exit(f"{old.decode()} not found in {path}")
open(path, "wb").write(data.replace(old, new))
PY
    for tool in prometheus promtool prometheus-alertmanager amtool mtail prometheus-node-exporter; do
        [[ -x "$TOOLS/root/usr/bin/$tool" ]] || die "$tool is not in its Debian package"
        ln -s "../root/usr/bin/$tool" "$TOOLS/bin/$tool"
    done
    # /usr/bin/python3 with only the unpacked python3-* packages on its path; -s: no user site.
    cat >"$TOOLS/bin/docker-compose" <<EOF
#!/bin/sh
PYTHONPATH="$TOOLS/root/usr/lib/python3/dist-packages" exec /usr/bin/python3 -s "$TOOLS/root/usr/bin/docker-compose" "\$@"
EOF
    chmod 755 "$TOOLS/bin/docker-compose"
    echo "$want" >"$stamp"
fi

# Chromium and its driver: Debian's chromium and chromium-driver (one version: the driver refuses another
# browser build), and those of their libraries that this host lacks (what `apt-get install -s` would
# install), unpacked into $TOOLS/chromium; $TOOLS/bin/chromium and $TOOLS/bin/chromedriver run them with
# those libraries on LD_LIBRARY_PATH. A chromium and a chromedriver already on PATH are used as they are
# (if of one version). Done again when either does not run or their versions differ.
chromium_ok() {
    local browser driver
    browser="$("$TOOLS/bin/chromium" --headless --no-sandbox --version 2>/dev/null)" || return 1
    driver="$("$TOOLS/bin/chromedriver" --version 2>/dev/null)" || return 1
    # "Chromium 150.0.7871.100" and "ChromeDriver 150.0.7871.100 (…)": the same build.
    [[ -n "$browser" && "$(awk '{print $2}' <<<"$browser")" == "$(awk '{print $2}' <<<"$driver")" ]]
}
if ! chromium_ok; then
    host_path="${PATH//"$TOOLS/bin"/}" # not the links this replaces
    if PATH="$host_path" command -v chromium >/dev/null && PATH="$host_path" command -v chromedriver >/dev/null; then
        ln -sfn "$(PATH="$host_path" command -v chromium)" "$TOOLS/bin/chromium"
        ln -sfn "$(PATH="$host_path" command -v chromedriver)" "$TOOLS/bin/chromedriver"
    else
        need_apt
        # What `apt-get install` would add; not upgrades ("Inst libc6 [old] (new …)"): a newer libc
        # next to the host's own loader would not run.
        sim() {
            apt-get install -s --no-install-recommends chromium chromium-driver 2>/dev/null |
                awk '/^Inst / && $3 !~ /^\[/ {print $2}'
        }
        missing="$(sim || true)"
        if [[ -z "$missing" ]]; then
            apt_update "apt-get cannot find chromium"
            missing="$(sim || true)"
            [[ -n "$missing" ]] || die "apt-get cannot find Debian's chromium and chromium-driver packages; elsewhere put chromium and chromedriver on PATH"
        fi
        rm -rf "${tmp:-}"
        tmp="$(mktemp -d)"
        say "downloading chromium, chromium-driver and $(($(wc -w <<<"$missing") - 2)) of their libraries into $TOOLS/chromium (≈125 MB, ≈420 MB unpacked)"
        # shellcheck disable=SC2086 # one package name per word
        download "$tmp" $missing
        # Unpacked beside the old one, then swapped: a browser that runs meanwhile keeps its files.
        rm -rf "$TOOLS/chromium.new" "$TOOLS/chromium.old"
        mkdir -p "$TOOLS/chromium.new" "$TOOLS/bin"
        for deb in "$tmp"/*.deb; do
            dpkg -x "$deb" "$TOOLS/chromium.new"
        done
        [[ -x "$TOOLS/chromium.new/usr/lib/chromium/chromium" ]] || die "chromium is not in its Debian package"
        [[ -x "$TOOLS/chromium.new/usr/bin/chromedriver" ]] || die "chromedriver is not in Debian's chromium-driver package"
        libs="$(cd "$TOOLS/chromium.new" && find . -name '*.so*' -printf "$TOOLS/chromium/%h\n" | sed 's|/\./|/|' | sort -u | paste -sd:)"
        [[ ! -e "$TOOLS/chromium" ]] || mv "$TOOLS/chromium" "$TOOLS/chromium.old"
        mv "$TOOLS/chromium.new" "$TOOLS/chromium"
        rm -rf "$TOOLS/chromium.old"
        for tool in chromium:usr/lib/chromium/chromium chromedriver:usr/bin/chromedriver; do
            cat >"$TOOLS/bin/${tool%%:*}" <<EOF
#!/bin/sh
LD_LIBRARY_PATH="${libs}\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "$TOOLS/chromium/${tool#*:}" "\$@"
EOF
            chmod 755 "$TOOLS/bin/${tool%%:*}"
        done
    fi
fi

for tool in promtool amtool mtail; do
    "$TOOLS/bin/$tool" --version >/dev/null 2>&1 || die "$TOOLS/bin/$tool does not run"
done
"$TOOLS/bin/docker-compose" version --short >/dev/null 2>&1 ||
    die "$TOOLS/bin/docker-compose does not run (it needs /usr/bin/python3 from Debian or Ubuntu)"
"$TOOLS/bin/chromium" --headless --no-sandbox --version >/dev/null 2>&1 || die "$TOOLS/bin/chromium does not run"
chromium_ok || die "$TOOLS/bin/chromedriver does not run, or is not of chromium's version"
say "tools in $TOOLS/bin: $("$TOOLS/bin/promtool" --version 2>&1 | head -1)"
