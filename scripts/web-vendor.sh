#!/usr/bin/env bash
# Fetch the web view's vendored libraries from the npm registry as
# web/assets/vendor/MANIFEST lists them, checking each tarball's
# integrity, into DEST (default: web/assets/vendor). Reproducible: the
# same manifest gives the same bytes.
set -euo pipefail
cd "$(dirname "$0")/.."
manifest=web/assets/vendor/MANIFEST
dest=${1:-web/assets/vendor}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$dest"
grep -v '^#' "$manifest" | while read -r pkg version integrity file name sha; do
	[ -n "$pkg" ] || continue
	tgz=$work/$(echo "$pkg" | tr -d @ | tr / -)-$version.tgz
	if [ ! -f "$tgz" ]; then
		(cd "$work" && npm pack --silent "$pkg@$version" >/dev/null)
		got="sha512-$(openssl dgst -sha512 -binary "$tgz" | base64 -w0)"
		if [ "$got" != "$integrity" ]; then
			echo "web-vendor: $pkg@$version: integrity $got, manifest says $integrity" >&2
			exit 1
		fi
	fi
	tar -xzf "$tgz" -C "$work" "$file"
	cp "$work/$file" "$dest/$name"
	got=$(sha256sum "$dest/$name" | cut -d' ' -f1)
	if [ -n "$sha" ] && [ "$got" != "$sha" ]; then
		echo "web-vendor: $name: sha256 $got, manifest says $sha" >&2
		exit 1
	fi
	echo "$name $got"
done
