#!/usr/bin/env bash
# Installs the Debian packages kinst's build, demo and tests need. Quick
# when everything is there already.
set -euo pipefail
# makedumpfile: the kdump tests make the standard form with -R.
# crash: the slab walk is checked against its kmem -s (it skips without it).
# lcov: genhtml renders the coverage tracefiles in the tests (they skip without it).
# librsvg2-bin and nodejs: the flame graph tests rasterise the SVG and run
# its script (they skip without them).
pkgs=(qemu-system-x86 busybox-static cpio make gcc binutils kmod xz-utils zstd makedumpfile crash lcov librsvg2-bin nodejs)
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
