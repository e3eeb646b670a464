#!/usr/bin/env bash
# Installs the Debian packages kinst's build, demo and tests need. Quick
# when everything is there already.
set -euo pipefail
# makedumpfile: the kdump tests make the standard form with -R.
# crash: the slab walk is checked against its kmem -s (it skips without it).
# lcov: genhtml renders the coverage tracefiles in the tests (they skip without it).
# librsvg2-bin and chromium: the flame graph tests rasterise the SVG and
# click, zoom and search it in headless Chromium (they skip without them).
# lld and gdb: the unwind tests link with ld.lld and compare stacks with gdb's.
# g++ and libc6-dbg: demangling is checked on a C++ program, libc's
# internal frames are named through its debug package, as gdb names them.
# zstd: Debian's 6.12 kernel images are zstd-compressed.
pkgs=(qemu-system-x86 busybox-static cpio make gcc binutils kmod xz-utils zstd makedumpfile crash lcov librsvg2-bin chromium)
pkgs+=(lld gdb g++ libc6-dbg)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
	echo "deps: missing packages: ${missing[*]} (run as root, or apt-get install them)" >&2
	exit 1
fi
echo "deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
