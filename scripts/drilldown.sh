#!/usr/bin/env bash
# make drilldown: KernInst's §5 investigation on Linux. An open(O_CREAT|
# O_TRUNC)-heavy workload runs while kinst times do_sys_openat2 (the paper's
# copen) and the functions it calls, follows the heaviest callee and
# repeats, printing the drill-down table of each level; then the same
# workload under kinst time with the dominant functions, charted.
set -euo pipefail
cd "$(dirname "$0")/.."
kinst=bin/kinst
$kinst vm down >/dev/null 2>&1 || true
$kinst vm up
trap '$kinst vm down' EXIT
work="kinst workload creat /tmp 3000"
echo
echo "\$ kinst drilldown copen -- $work"
$kinst vm exec -- kinst drilldown do_sys_openat2 -- $work
echo
echo "\$ kinst time do_sys_openat2 do_filp_open path_openat --interval 500ms -- $work"
$kinst vm exec -- kinst time do_sys_openat2 do_filp_open path_openat --interval 500ms --svg /tmp/copen.svg -- $work
