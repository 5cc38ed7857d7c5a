#!/bin/bash
# The kernel matrix's guest side, run as PID 1 on the host's root (read-only
# 9p under a tmpfs overlay). /job is the host's job directory: `env` (exports
# for the tests), `cases.tsv` (name TAB shell command, one test a line); this
# writes `kernel`, `results.tsv` (name TAB pass|fail TAB seconds) and
# `logs/NAME.log`, then powers the machine off. /tmp is the host's, under the
# overlay: a checkout there (a CI clone) stays visible; scratch goes to the
# test disk (TMPDIR).
set -u
mount -t proc proc /proc 2>/dev/null
mount -t sysfs sys /sys 2>/dev/null
mount -t devtmpfs dev /dev 2>/dev/null
mount -t tracefs tracefs /sys/kernel/tracing
mount -t debugfs debugfs /sys/kernel/debug
mount -t bpf bpf /sys/fs/bpf
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mkdir -p /dev/shm && mount -t tmpfs tmpfs /dev/shm
# 5.10 charges BPF maps to RLIMIT_MEMLOCK.
ulimit -l unlimited
echo 1 > /proc/sys/kernel/sysrq
off() { sync; echo o > /proc/sysrq-trigger; sleep 30; }
trap off EXIT

uname -r > /job/kernel
mkdir -p /job/logs /mnt/disk
if ! mount -t ext4 /dev/vda /mnt/disk; then
    echo "guest: cannot mount the test disk /dev/vda" > /job/logs/setup.log
    exit
fi
# shellcheck disable=SC1091
. /job/env
: > /job/results.tsv
while IFS=$'\t' read -r name command; do
    [ -n "$name" ] || continue
    start=$(date +%s.%N)
    if (cd /mnt/disk && timeout "${CASE_TIMEOUT:-900}" bash -c "$command") > "/job/logs/$name.log" 2>&1 < /dev/null; then
        status=pass
    else
        status=fail
    fi
    end=$(date +%s.%N)
    printf '%s\t%s\t%s\n' "$name" "$status" "$(awk "BEGIN { printf \"%.1f\", $end - $start }")" >> /job/results.tsv
    sync
done < /job/cases.tsv
