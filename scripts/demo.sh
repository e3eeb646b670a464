#!/usr/bin/env bash
# make demo: boot the test VM (stock Debian kernel, kerninst.ko, kerninstd),
# count lookuppn live while a small file-system workload runs, shut down.
set -euo pipefail
cd "$(dirname "$0")/.."
kinst=bin/kinst
$kinst vm down >/dev/null 2>&1 || true
$kinst vm up
trap '$kinst vm down' EXIT
echo
echo '$ kinst count lookuppn --interval 1s -- sh -c "workload: stat, create, read, remove files"'
$kinst vm exec -- kinst count lookuppn --interval 1s -- sh -c '
  for i in 1 2 3 4 5; do
    kinst workload stat 2000 /etc
    kinst workload files /tmp 300
    ls -lR /sys/kernel >/dev/null 2>&1
    sleep 1
  done'
echo
echo '$ kinst rd filename_lookup 32      # the original bytes are back'
$kinst vm exec -- kinst rd filename_lookup 32
