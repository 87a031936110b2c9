#!/usr/bin/env bash
# Installs what the build, tests and benchmarks need, only when it is missing:
# Debian packages through apt-get (we run as root on the target machines) and the pinned npm
# packages of package.json (llama.cpp through node-llama-cpp, the numeric oracle and speed peer).
# chromium: the headless browser the status page test loads the page in; prometheus: the real
# Prometheus that scrapes serve in an end-to-end test (with the recording rules of deploy/).
set -euo pipefail
cd "$(dirname "$0")/.."

need_pkgs=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
# clang + libclang-rt-14-dev: the libFuzzer targets (tests/fuzz, `make fuzz`); Debian 12's clang.
# chromium: the status page's browser test; prometheus: the scrape test of the recording rules.
# gcc-aarch64-linux-gnu + qemu-user: the aarch64 build and its tests (`make arm64`).
# python3-numpy: llama.cpp's gguf-py, which writes the MoE oracle test's models (tests/oracle/gguf_moe.py).
for p in gcc-aarch64-linux-gnu qemu-user build-essential pkg-config libpcre2-dev libssl-dev libjansson-dev libmicrohttpd-dev libisal-dev clang libclang-rt-14-dev nodejs npm git chromium prometheus python3-numpy; do
  if [ "$p" = nodejs ] || [ "$p" = npm ]; then
    command -v "${p/nodejs/node}" >/dev/null 2>&1 && continue
  fi
  have_pkg "$p" || need_pkgs+=("$p")
done
if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "deps: installing Debian packages: ${need_pkgs[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

# The aarch64 libraries the build links, unpacked into a sysroot (build/arm64/sysroot) rather
# than installed: Debian's libisal-dev cannot be installed for two architectures at once, and
# the arm64 -dev packages would force their versions onto the host's amd64 ones. The list is
# the five -dev packages, their runtime libraries and those libraries' dependencies (gnutls's,
# for libmicrohttpd); the stamp holds the list, so a changed list is fetched again.
arm_sysroot=build/arm64/sysroot
arm_pkgs="libpcre2-dev libpcre2-8-0 libssl-dev libssl3 libjansson-dev libjansson4 libmicrohttpd-dev
  libmicrohttpd12 libisal-dev libisal2 libgnutls30 libp11-kit0 libidn2-0 libhogweed6 libnettle8
  libtasn1-6 libunistring2 libgmp10 libffi8"
arm_want=$(echo $arm_pkgs | sha256sum | cut -d' ' -f1)
if [ "$(cat "$arm_sysroot/.stamp" 2>/dev/null)" != "$arm_want" ]; then
  echo "deps: fetching the arm64 libraries into $arm_sysroot"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    $SUDO dpkg --add-architecture arm64
    $SUDO apt-get update -qq
  fi
  rm -rf "$arm_sysroot" build/arm64/debs; mkdir -p "$arm_sysroot" build/arm64/debs
  (cd build/arm64/debs && apt-get download -qq $(printf '%s:arm64 ' $arm_pkgs)) >/dev/null
  for d in build/arm64/debs/*.deb; do dpkg-deb -x "$d" "$arm_sysroot"; done
  rm -rf build/arm64/debs
  echo "$arm_want" > "$arm_sysroot/.stamp"
fi

# npm: only the linux-x64 CPU build of node-llama-cpp is needed; skip the optional GPU builds.
# The stamp holds the lock file's hash, not a time: a fresh checkout (newer files, same lock)
# sharing node_modules must not reinstall it under another checkout's running tests.
stamp=node_modules/.tokenmill-stamp
want=$(sha256sum package.json package-lock.json | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "deps: installing npm packages (pinned in package-lock.json)"
  npm ci --omit=optional --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null
  echo "$want" > "$stamp"
fi
