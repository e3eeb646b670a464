/* SPDX-License-Identifier: GPL-2.0 */
/*
 * kerninst.ko user ABI: ioctls on /dev/kerninst.
 *
 * The driver only does what needs kernel context and checks every argument;
 * all policy (what to splice, where in the patch heap a patch goes, which
 * counter a patch bumps) lives in kerninstd, which also allocates the patch
 * heap. This header is mirrored by driver/abi.go; keep both in step and bump
 * KI_ABI_VERSION on any change.
 */
#ifndef KERNINST_UAPI_H
#define KERNINST_UAPI_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define KI_ABI_VERSION 5
#define KI_MAX_INSN 15

/* KI_IOC_INFO: layout of the driver's heaps. */
struct ki_info {
	__u32 abi_version;
	__u32 chunk_size;      /* patch heap granule: patches start on it, see below */
	__u64 patch_heap;      /* kernel address of the executable patch heap */
	__u64 patch_heap_size; /* bytes */
	__u64 counter_heap;    /* kernel address of the counter heap (u64 slots) */
	__u64 counter_heap_size; /* bytes; mmap offset 0 maps it read-only */
	__u64 module_text;     /* [module_text, module_text+module_text_size): our own text, never spliced */
	__u64 module_text_size;
	__u32 nr_splices;      /* splices currently installed */
	__u32 int3_hits;       /* CPUs sent to a patch by the int3 notifier (wraps) */
	__u64 syncs;           /* rounds of "every CPU runs a serialising instruction" so far */
	__u32 max_splices;     /* most splices installed at once */
	__u32 batch_max;       /* most splices in one KI_IOC_SPLICE_BATCH or KI_IOC_UNSPLICE_BATCH */
};

/* KI_IOC_READ: copy len bytes of kernel memory at addr to user buffer buf.
 * Faults return -EFAULT, never oops. len <= 1 MiB. */
struct ki_read {
	__u64 addr;
	__u64 buf;
	__u64 len;
};

/*
 * The patch heap is allocated in user space, in chunks of chunk_size bytes;
 * the driver keeps two facts per chunk, which make rewriting it safe:
 *  - busy: an installed splice sends CPUs into it (its patch range,
 *    [patch, patch+patch_len) of KI_IOC_SPLICE or KI_IOC_RESPLICE, touches
 *    the chunk);
 *  - entered: a splice has sent CPUs into it since the last RCU-tasks grace
 *    period, so a preempted task may still be running there.
 */

/* KI_IOC_PATCH_WRITE: write len bytes from user buf at [addr, addr+len) in
 * the patch heap, through a temporary writable alias. Refused (-EBUSY) if
 * the range touches a busy chunk; waits for synchronize_rcu_tasks() first if
 * it touches an entered one (memory never entered is written at once). Free
 * memory is kept int3: user space writes int3 over a patch it frees. */
struct ki_patch_write {
	__u64 addr;
	__u64 buf;
	__u64 len;
};

/* KI_IOC_SPLICE: overwrite the one instruction at addr.
 *   orig[0..len)  the bytes the caller expects there now (checked);
 *   new[0..len)   the replacement, one of:
 *     "e9 rel32" (len 5) jumping to patch: a direct splice, or with
 *                 KI_SPLICE_SLOT a springboard slot written into padding
 *                 (orig may then hold int3 padding bytes);
 *     "eb rel8"  (len 2) jumping to an installed slot: a springboard
 *                 splice; patch must be that slot's address;
 *     int3       (len 1): a trap splice;
 *   patch         a patch in the patch heap, on a chunk boundary (the slot,
 *                 for "eb rel8"): where a CPU that hits the int3 (during
 *                 the write, or forever for a trap splice) is sent by the
 *                 die notifier;
 *   patch_len     the patch's length: [patch, patch+patch_len) must lie in
 *                 the heap, and stays busy while the splice is installed
 *                 (0 for "eb rel8", whose slot is itself a splice).
 * Written with the text_poke_bp protocol: int3, sync all CPUs, tail, sync,
 * first byte, sync. id is returned; splices never overlap.
 * With KI_SPLICE_COVER, a direct splice's 5 bytes span several whole
 * instructions (the caller proved nothing jumps into them and the patch
 * runs them all): only the int3 is written, and the splice works as a trap
 * splice until KI_IOC_COVER_FINISH writes the jmp after an RCU-tasks grace
 * period, so no task preempted or interrupted between those instructions
 * resumes inside the jmp. */
#define KI_SPLICE_SLOT 1u
#define KI_SPLICE_COVER 2u

struct ki_splice {
	__u64 addr;
	__u64 patch;
	__u32 len;
	__u32 id; /* out */
	__u8 orig[16];
	__u8 new[16];
	__u32 flags; /* KI_SPLICE_SLOT, KI_SPLICE_COVER */
	__u32 patch_len;
};

/* KI_IOC_RESPLICE: point installed splice id at another patch (checked as
 * for KI_IOC_SPLICE), so a point's instrumentation can change without a
 * moment where the point runs neither the old nor the new patch. A direct splice or slot gets its
 * jmp rel32 rewritten (int3, sync, rel32, sync, e9, sync; a CPU that hits
 * the int3 meanwhile goes to the new patch); a trap splice only changes
 * where its int3 sends CPUs. A springboard splice ("eb rel8") is re-pointed
 * through its slot. The old patch may still be running on some task: it
 * stays entered, so it is rewritten only after an RCU-tasks grace period. */
struct ki_resplice {
	__u32 id;
	__u32 patch_len;
	__u64 patch;
};

/* KI_IOC_COVER_FINISH: wait for an RCU-tasks grace period (without holding
 * the driver's lock), then write the jmp of every covering splice armed
 * before the wait and still installed. done: how many. */
struct ki_cover_finish {
	__u32 done; /* out */
	__u32 pad;
};

/* KI_IOC_UNSPLICE: restore the original bytes of splice id (same protocol). */
struct ki_unsplice {
	__u32 id;
	__u32 pad;
};

/* KI_IOC_SPLICE_BATCH: install n splices (ops: the user address of struct
 * ki_splice[n], each checked as for KI_IOC_SPLICE and against the others)
 * all or none, in one round of the protocol: int3 at every site, sync; every
 * tail, sync; every first byte, sync -- the CPU synchronisations of one
 * splice (the kernel's text_poke_bp_batch does the same). Each id is written
 * back into ops. On error nothing changed and failed is the index of the
 * splice refused (n if the error is not one splice's).
 * KI_IOC_UNSPLICE_BATCH: restore n splices (ops: the user address of
 * __u32 ids[n], as for KI_IOC_UNSPLICE; an id twice is -EINVAL) all or none,
 * in one round; failed as above. A slot still jumped to is -EBUSY even if
 * the springboard splices that jump to it are in the same batch. */
struct ki_batch {
	__u64 ops;
	__u32 n;      /* 1..batch_max */
	__u32 failed; /* out, also on error */
};

/* KI_IOC_COUNTERS_CLEAR: zero counter slots [first, first+count). */
struct ki_counters_clear {
	__u32 first;
	__u32 count;
};

#define KI_IOC_MAGIC 0xB7
#define KI_IOC_INFO           _IOR(KI_IOC_MAGIC, 0, struct ki_info)
#define KI_IOC_READ           _IOW(KI_IOC_MAGIC, 1, struct ki_read)
/* 2 and 4 were PATCH_ALLOC and PATCH_FREE (ABI 3) */
#define KI_IOC_PATCH_WRITE    _IOW(KI_IOC_MAGIC, 3, struct ki_patch_write)
#define KI_IOC_SPLICE         _IOWR(KI_IOC_MAGIC, 5, struct ki_splice)
#define KI_IOC_UNSPLICE       _IOW(KI_IOC_MAGIC, 6, struct ki_unsplice)
#define KI_IOC_COUNTERS_CLEAR _IOW(KI_IOC_MAGIC, 7, struct ki_counters_clear)
#define KI_IOC_RESPLICE       _IOW(KI_IOC_MAGIC, 8, struct ki_resplice)
#define KI_IOC_COVER_FINISH   _IOR(KI_IOC_MAGIC, 9, struct ki_cover_finish)
#define KI_IOC_SPLICE_BATCH   _IOWR(KI_IOC_MAGIC, 10, struct ki_batch)
#define KI_IOC_UNSPLICE_BATCH _IOWR(KI_IOC_MAGIC, 11, struct ki_batch)

#endif
