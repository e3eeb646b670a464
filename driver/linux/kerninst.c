// SPDX-License-Identifier: GPL-2.0
// Go tooling: this file is kernel C, embedded by embed.go, never built by cgo.
//go:build ignore

/*
 * kerninst.ko: the kernel half of kinst.
 *
 * It does only what needs kernel context -- read kernel memory, write the
 * patch heap through a temporary alias, splice and unsplice one instruction
 * with the text_poke_bp protocol, send CPUs that hit a splice's int3 to its
 * patch -- and checks every argument it is given. What to splice, where in
 * the patch heap each patch goes and the code in it are decided in user
 * space (kerninstd). The driver refuses to rewrite patch memory a splice
 * leads to, and rewrites memory a splice led to only once no task can
 * still be running there.
 *
 * /dev/kerninst opens exclusively. The opener owns every splice and the
 * patch heap: release() restores all of them, so a crashed owner leaves
 * the kernel as it found it. fops.owner pins the module while the device
 * is open (or mapped), so there is nothing to restore at rmmod. When
 * another module whose text holds a splice is unloaded, the splice is
 * taken out first (ki_module_notify).
 *
 * Locking:
 *   ki_lock (mutex) serialises every ioctl, release() and the module
 *     notifier; it protects the fields marked [ki_lock] below. Writers of
 *     the splice records hold it.
 *   The int3 notifier runs in NMI-like context (interrupts off, may
 *     interrupt anything, including a holder of ki_lock) and takes no lock:
 *     it binary-searches the published sorted index (ki_live_idx, loaded
 *     with acquire) and reads the record's patch with READ_ONCE. Writers
 *     rebuild the other of two index buffers and publish it with release;
 *     a buffer is rewritten only after every CPU has synced since it was
 *     retired (ki_spare_dirty), and a CPU cannot take that IPI while it is
 *     in the notifier. See ki_die_notify.
 *   ki_is_open (atomic) is the exclusive-open flag; release() clears it
 *     last, after everything is restored.
 */
#include <linux/module.h>
#include <linux/miscdevice.h>
#include <linux/fs.h>
#include <linux/uaccess.h>
#include <linux/mm.h>
#include <linux/vmalloc.h>
#include <linux/slab.h>
#include <linux/mutex.h>
#include <linux/bitmap.h>
#include <linux/kdebug.h>
#include <linux/smp.h>
#include <linux/rcupdate.h>
#include <linux/delay.h>
#include <linux/stringify.h>
#include <linux/sort.h>
#include <linux/bsearch.h>
#include <linux/cpu.h>
#include <linux/stop_machine.h>
#include <linux/objtool.h>
#include <asm/sync_core.h>
#include <asm/pgtable.h>
#include <linux/version.h>
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 12, 0)
#include <linux/unaligned.h>	/* moved from asm/ in 6.12 */
#else
#include <asm/unaligned.h>
#endif

#include "kerninst_uapi.h"

/*
 * Version differences, kept here and few:
 * - 6.4 split a module's memory into mem[MOD_TEXT], mem[MOD_DATA], ...;
 *   before, core_layout held text first, then rodata and data.
 * - 6.3 made vma->vm_flags read-only (vm_flags_set/vm_flags_clear).
 */
static unsigned long ki_mod_text(const struct module *m, unsigned long *size)
{
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 4, 0)
	*size = m->mem[MOD_TEXT].size;
	return (unsigned long)m->mem[MOD_TEXT].base;
#else
	*size = m->core_layout.text_size;
	return (unsigned long)m->core_layout.base;
#endif
}

static void ki_vma_flags(struct vm_area_struct *vma, vm_flags_t set, vm_flags_t clear)
{
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 3, 0)
	vm_flags_mod(vma, set, clear);
#else
	vma->vm_flags = (vma->vm_flags & ~clear) | set;
#endif
}

/* Sized for a coverage session over every block of a kernel (about 550,000
 * in 6.1): a hit flag's patch takes one 32-byte chunk, a counter slot is 8
 * bytes. */
#define KI_HEAP_SIZE	(32 << 20)		/* patch heap, bytes */
#define KI_CHUNK	32			/* patch heap granule */
#define KI_NCHUNKS	(KI_HEAP_SIZE / KI_CHUNK)
#define KI_COUNTER_SIZE	(8 << 20)		/* counter heap, bytes */
#define KI_ID_SHIFT	20
#define KI_MAX_SPLICES	(1 << KI_ID_SHIFT)	/* a splice id's low bits: its record */
#define KI_REC_BLOCK	4096			/* records allocated at a time */
#define KI_MAX_READ	(1 << 20)
#define KI_INT3		0xcc
#define KI_JMP32	0xe9
#define KI_JMP32_LEN	5
#define KI_JMP8		0xeb
#define KI_JMP8_LEN	2
#define KI_RETRIES	100			/* restore attempts at release */
#define KI_BATCH_MAX	4096			/* splices in one batch ioctl */

/*
 * The patch heap: executable bytes in this module's own text, so the module
 * loader places it in the module area, within rel32 reach of kernel text
 * and of every module. The loader maps it read-only and executable like the
 * rest of our text; we write it only through a temporary writable alias
 * (ki_map), never by lifting write protection. Unused bytes are int3, so a
 * stray jump traps. The section is "ax" so it is laid out with our text;
 * the label is a plain (untyped) symbol, not a function, so objtool treats
 * the bytes as data-in-text (it does not validate 8 MiB of int3 as code)
 * and no ORC entries are generated for it. The address is taken but is
 * no indirect-call target, so it is marked no-ENDBR for objtool (IBT).
 * The build turns the section into NOBITS (driver/linux.Build) so the .ko
 * does not carry 32 MiB of int3; the loader zeroes it and ki_init fills it
 * with int3 before anything can jump there.
 */
asm(".pushsection .text.kinst_heap,\"ax\",@progbits\n"
    ".balign 4096\n"
    ".globl ki_patch_heap\n"
    "ki_patch_heap:\n"
    ANNOTATE_NOENDBR	/* IBT kernels: referenced, never an indirect-call target */
    ".fill " __stringify(KI_HEAP_SIZE) ",1,0xcc\n"
    ".popsection\n");
extern u8 ki_patch_heap[];

/* The counter heap: patches bump slots with "lock incq [rip+disp32]". It is
 * module data (vmalloc'ed by the loader), mmap'ed read-only into the owner.
 * Zeroed at every open. */
static u64 ki_counters[KI_COUNTER_SIZE / sizeof(u64)] __aligned(PAGE_SIZE);

/* What a splice writes. */
enum ki_kind {
	KI_DIRECT = 1,	/* jmp rel32 to a patch */
	KI_SLOT,	/* jmp rel32 to a patch, written into padding: a springboard */
	KI_SHORT,	/* jmp rel8 to a KI_SLOT splice */
	KI_TRAP,	/* a permanent int3 sent to a patch by ki_die_notify */
};

/* One installed splice. */
struct ki_splice_rec {
	unsigned long addr;	/* [ki_lock] 0: free record */
	unsigned long patch;	/* where an int3 hit at addr is sent: WRITE_ONCE under ki_lock, READ_ONCE by the notifier */
	struct ki_splice_rec *slot;	/* [ki_lock] KI_SHORT: the slot it jumps to */
	/* [ki_lock] a covering splice armed (int3 only) at this ki_cover_seq,
	 * waiting for KI_IOC_COVER_FINISH; 0 once its jmp is written */
	u64 pending;
	u32 c0, c1;		/* [ki_lock] patch's heap chunks [c0, c1); none for KI_SHORT */
	u32 id;			/* [ki_lock] low KI_ID_SHIFT bits: its index (ki_rec) */
	u32 len;		/* [ki_lock] bytes written at addr */
	u32 users;		/* [ki_lock] KI_SLOT: KI_SHORT splices that jump to it */
	u32 next_free;		/* [ki_lock] a free record: the next free one's index */
	u8 kind;		/* [ki_lock] enum ki_kind */
	bool marked;		/* [ki_lock] named in the batch being checked */
	u8 orig[KI_MAX_INSN];	/* [ki_lock] the bytes to put back */
};

/* The notifier's view of the installed splices: addresses sorted, each with
 * its record. Two buffers: one published (ki_live_idx), one spare. */
struct ki_index {
	int n;
	int cap;	/* [ki_lock] entries allocated; both buffers hold every record (ki_grow) */
	unsigned long *addr;
	struct ki_splice_rec **rec;
};

static DEFINE_MUTEX(ki_lock);

/* The splice records grow a block at a time (ki_grow), up to KI_MAX_SPLICES:
 * a whole-kernel session needs half a million, a count session a few. A
 * record never moves once allocated: the notifier holds pointers to them.
 * Record i is ki_rec(i). */
static struct ki_splice_rec *ki_rec_blocks[KI_MAX_SPLICES / KI_REC_BLOCK];	/* [ki_lock] */
static u32 ki_nr_blocks;	/* [ki_lock] blocks allocated */
/* [ki_lock] records ever used: [0, ki_nr_slots) */
static u32 ki_nr_slots;
static u32 ki_free_head;	/* [ki_lock] first free record below ki_nr_slots (next_free chain) */
static u32 ki_nr_free;		/* [ki_lock] records on that chain */
static u32 ki_nr_splices;	/* [ki_lock] installed splices */
static u32 ki_next_seq = 1;	/* [ki_lock] a splice id's high bits, never 0 */
/* [ki_lock] covering splices armed so far (their pending sequence) */
static u64 ki_cover_seq;
static u64 ki_syncs;		/* [ki_lock] rounds of ki_sync_all and stop_machine, for benchmarks */
/* [ki_lock] installed splices whose patch touches each heap chunk (a
 * chunk starts at most one patch and its patch's splice, so u16 is ample) */
static u16 *ki_busy;
/* [ki_lock] patch heap chunks a splice sends CPUs into, or sent them into
 * since the last synchronize_rcu_tasks(): a task may be running there */
static DECLARE_BITMAP(ki_entered, KI_NCHUNKS);

static struct ki_index ki_idx[2];	/* [ki_lock] for writers */
static struct ki_index *ki_live_idx = &ki_idx[0];	/* published with release; read with acquire */
/* [ki_lock] the spare index buffer was published since the last ki_sync_all:
 * a notifier may still be reading it */
static bool ki_spare_dirty;

/* [ki_lock] CPU hotplug is disabled: some splice is installed (ki_hotplug) */
static bool ki_hotplug_off;

static atomic_t ki_is_open = ATOMIC_INIT(0);
static atomic_t ki_int3_hits = ATOMIC_INIT(0);	/* redirects by ki_die_notify */

static inline struct ki_splice_rec *ki_rec(u32 i)
{
	return &ki_rec_blocks[i / KI_REC_BLOCK][i % KI_REC_BLOCK];
}

/* for each installed splice r, record index i (writers, under ki_lock) */
#define ki_for_each(r, i) \
	for (i = 0; i < ki_nr_slots; i++) \
		if (!(r = ki_rec(i))->addr) {} else

static void ki_tables_free(void)
{
	u32 i;

	for (i = 0; i < ki_nr_blocks; i++)
		kvfree(ki_rec_blocks[i]);
	ki_nr_blocks = 0;
	vfree(ki_busy);
	for (i = 0; i < 2; i++) {
		kvfree(ki_idx[i].addr);
		kvfree(ki_idx[i].rec);
	}
}

static int ki_tables_alloc(void)
{
	ki_busy = vzalloc(array_size(KI_NCHUNKS, sizeof(*ki_busy)));
	return ki_busy ? 0 : -ENOMEM;
}

/* ---- text access ---------------------------------------------------- */

/* ki_area: 1 in the kernel image mapping, 2 in the module area, else 0. */
static int ki_area(unsigned long addr)
{
	if (addr >= __START_KERNEL_map && addr < MODULES_VADDR)
		return 1;
	return addr >= MODULES_VADDR && addr < MODULES_END ? 2 : 0;
}

/*
 * ki_spliceable: every byte of [addr, addr+len) is kernel or module text,
 * and none is this module's (text, heap, data).
 *
 * core_kernel_text() and is_module_text_address() would say this directly
 * but are not exported to modules. The equivalent: the range lies in the
 * kernel image mapping or the module area, and every page of it is present
 * and executable. In the kernel image only text is executable (rodata and
 * data are NX, freed init text is unmapped); in the module area that is
 * module text, plus other generated code (BPF programs, ftrace and kprobe
 * trampolines) that user space may legitimately want to instrument.
 */
static bool ki_spliceable(unsigned long addr, size_t len)
{
	unsigned long a, last = addr + len - 1;
	unsigned int level;
	pte_t *pte;

	/* Never our own module: both ends checked, len is at most a page. */
	if (!len || last < addr || len > PAGE_SIZE || !ki_area(addr) || ki_area(addr) != ki_area(last) ||
	    within_module(addr, THIS_MODULE) || within_module(last, THIS_MODULE))
		return false;
	for (a = addr & PAGE_MASK; a <= last; a += PAGE_SIZE) {
		pte = lookup_address(a, &level);
		if (!pte || !pte_present(*pte) || !pte_exec(*pte))
			return false;
	}
	return true;
}

/* ki_map: a temporary writable alias (vmap, PAGE_KERNEL; ki_unmap it) of
 * text [addr, addr+len), at most a page; the text mapping stays read-only.
 * Kernel image text is mapped with large pages at __START_KERNEL_map, which
 * virt_to_page translates; module text is vmalloc memory. */
static u8 *ki_map(unsigned long addr, size_t len)
{
	unsigned long last = addr + len - 1;
	struct page *pg[2];
	int i;
	u8 *map;

	if (!len || len > PAGE_SIZE)
		return NULL;
	for (i = 0; i < 2; i++) {
		unsigned long a = i ? last : addr;

		pg[i] = ki_area(a) == 1 ? virt_to_page((void *)a) :
			ki_area(a) == 2 ? vmalloc_to_page((void *)a) : NULL;
		if (!pg[i])
			return NULL;
	}
	map = vmap(pg, (addr ^ last) & PAGE_MASK ? 2 : 1, VM_MAP, PAGE_KERNEL);
	return map ? map + offset_in_page(addr) : NULL;
}

static void ki_unmap(u8 *p)
{
	vunmap((void *)((unsigned long)p & PAGE_MASK));
}

/* ki_text_write writes len bytes at text address addr: from src, or the
 * byte fill when src is NULL. */
static int ki_text_write(unsigned long addr, const u8 *src, u8 fill, size_t len)
{
	size_t done, n;
	u8 *p;

	for (done = 0; done < len; done += n) {
		n = min_t(size_t, len - done, PAGE_SIZE - offset_in_page(addr + done));
		p = ki_map(addr + done, n);
		if (!p)
			return -EFAULT;
		if (src)
			memcpy(p, src + done, n);
		else
			memset(p, fill, n);
		ki_unmap(p);
	}
	return 0;
}

static void ki_do_sync_core(void *unused)
{
	sync_core();
}

/* ki_sync_all makes every CPU execute a serialising instruction, so none
 * runs stale prefetched bytes. It returns only when every CPU has taken the
 * IPI -- which a CPU cannot do while it is inside the int3 handler. */
static void ki_sync_all(void)
{
	on_each_cpu(ki_do_sync_core, NULL, 1);
	ki_spare_dirty = false;
	ki_syncs++;
}

/* One instruction to overwrite: its first len bytes become bytes. */
struct ki_poke {
	unsigned long addr;
	const u8 *bytes;
	u32 len;
	u8 *map;	/* ki_poke_many's writable alias */
};

static int ki_ulong_cmp(const void *a, const void *b)
{
	unsigned long x = *(const unsigned long *)a, y = *(const unsigned long *)b;

	return x < y ? -1 : x > y;
}

/*
 * ki_map_many maps every page that v[0..n) touch, writable, as one alias,
 * and points each v[i].map into it; it returns the alias for vunmap, or
 * NULL. One vmap for a batch, not one per instruction: each vunmap may
 * purge lazily freed areas with a TLB flush on every CPU, and a batch of
 * 4,096 restores spent most of its time there (under TCG, 0.4 s a batch
 * once 200,000 splices were installed). An instruction that crosses into
 * the next page finds it next in the alias: both are in the sorted list
 * and no other page lies between them.
 */
static void *ki_map_many(struct ki_poke *v, u32 n)
{
	unsigned long *pa = kvmalloc_array(2 * n, sizeof(*pa), GFP_KERNEL);
	struct page **pg = kvmalloc_array(2 * n, sizeof(*pg), GFP_KERNEL);
	u8 *base = NULL;
	u32 i, j, np = 0;

	if (!pa || !pg)
		goto out;
	for (i = 0; i < n; i++) {
		unsigned long first = v[i].addr & PAGE_MASK, last;

		if (!v[i].len || v[i].len > KI_MAX_INSN)
			goto out;
		last = (v[i].addr + v[i].len - 1) & PAGE_MASK;
		pa[np++] = first;
		if (last != first)
			pa[np++] = last;
	}
	sort(pa, np, sizeof(*pa), ki_ulong_cmp, NULL);
	for (i = j = 0; i < np; i++)
		if (!j || pa[i] != pa[j - 1])
			pa[j++] = pa[i];
	np = j;
	for (i = 0; i < np; i++) {
		pg[i] = ki_area(pa[i]) == 1 ? virt_to_page((void *)pa[i]) :
			ki_area(pa[i]) == 2 ? vmalloc_to_page((void *)pa[i]) : NULL;
		if (!pg[i])
			goto out;
	}
	base = vmap(pg, np, VM_MAP, PAGE_KERNEL);
	if (!base)
		goto out;
	for (i = 0; i < n; i++) {
		unsigned long *at = bsearch(&(unsigned long){ v[i].addr & PAGE_MASK }, pa, np,
					    sizeof(*pa), ki_ulong_cmp);

		v[i].map = base + (at - pa) * PAGE_SIZE + offset_in_page(v[i].addr);
	}
out:
	kvfree(pa);
	kvfree(pg);
	return base;
}

/* ki_poke_firsts writes the first byte of each of v[0..n) that does not
 * stay an int3, then every instruction once more, whole, the int3-only ones
 * too (see ki_poke_many); run by stop_machine. */
struct ki_firsts {
	struct ki_poke *v;
	u32 n;
};

static int ki_poke_firsts(void *arg)
{
	const struct ki_firsts *f = arg;
	u32 i;

	for (i = 0; i < f->n; i++)
		if (f->v[i].bytes[0] != KI_INT3)
			WRITE_ONCE(*f->v[i].map, f->v[i].bytes[0]);
	for (i = 0; i < f->n; i++)
		memcpy(f->v[i].map, f->v[i].bytes, f->v[i].len);
	return 0;
}

/*
 * ki_poke_many overwrites n instructions (which must not overlap) as
 * text_poke_bp_batch does: int3 on every first byte, sync; every tail,
 * sync; every first byte, sync. So the whole batch costs the CPU
 * synchronisations of one instruction. A CPU that reaches one of them while
 * its bytes are mixed traps on the int3 and ki_die_notify sends it to the
 * splice's patch (which must therefore be published before the call), so no
 * CPU ever executes a torn instruction. Every alias is made before the
 * first write: a failure (-EFAULT, -ENOMEM) changes nothing.
 *
 * The first bytes are written with every other CPU parked in stop_machine,
 * for emulators: under QEMU's multi-threaded TCG a vCPU that translates an
 * instruction while another writes it can keep a translation of the int3
 * it read, which sync_core does not drop (a later write to those bytes
 * does). kprobe_int3_handler, which runs before ki_die_notify, sees no int3
 * in memory and backs up to "run the original instruction" -- the stale
 * int3 again, for ever; with interrupts off there, that CPU never takes the
 * sync's IPI and the writer waits for ever. Parked CPUs translate nothing,
 * and each instruction is written once more, whole, while they are parked,
 * which drops any translation made during the earlier steps. On hardware
 * the parking costs one more rendezvous of the CPUs.
 *
 * A batch that only writes int3s (a trap splice, a covering splice being
 * armed) is parked and rewritten too. TCG drops the translations of code a
 * store overwrites before it makes the store, so a vCPU running that code
 * can translate it again in between, from the old bytes, and keep that
 * translation until the next write there: a hot instruction given only its
 * int3 then does not trap there -- for a covering splice until its
 * jmp is written (KI_IOC_COVER_FINISH), for a trap splice for ever. Seen
 * as a timed region's covering entry and another region's covering exit
 * both skipped by the first call after they were armed (one run in
 * about 30 of TestTimeLineRange).
 */
static int ki_poke_many(struct ki_poke *v, u32 n)
{
	struct ki_firsts firsts = { .v = v, .n = n };
	bool tails = false;
	void *alias;
	u32 i;

	if (!n)
		return 0;
	alias = ki_map_many(v, n);
	if (!alias)
		return -EFAULT;
	for (i = 0; i < n; i++)
		tails |= v[i].len > 1;
	for (i = 0; i < n; i++)
		WRITE_ONCE(*v[i].map, KI_INT3);
	ki_sync_all();
	if (tails) {
		for (i = 0; i < n; i++)
			if (v[i].len > 1)
				memcpy(v[i].map + 1, v[i].bytes + 1, v[i].len - 1);
		ki_sync_all();
	}
	stop_machine(ki_poke_firsts, &firsts, NULL);
	ki_syncs++;
	ki_sync_all();
	vunmap(alias);
	return 0;
}

/* ki_poke is ki_poke_many of one instruction. */
static int ki_poke(unsigned long addr, const u8 *bytes, u32 len)
{
	struct ki_poke p = { .addr = addr, .bytes = bytes, .len = len };

	return ki_poke_many(&p, 1);
}

/* ki_jmp32 encodes "jmp rel32" at addr to target; -ERANGE out of reach. */
static int ki_jmp32(u8 jmp[KI_JMP32_LEN], unsigned long addr, unsigned long target)
{
	s64 rel = (s64)(target - (addr + KI_JMP32_LEN));

	if (rel != (s32)rel)
		return -ERANGE;
	jmp[0] = KI_JMP32;
	put_unaligned_le32((u32)(s32)rel, &jmp[1]);
	return 0;
}

/* ---- int3 redirection ------------------------------------------------ */

/*
 * ki_die_notify sends a CPU that hit the int3 of an installed splice to the
 * splice's patch: during a splice or unsplice (the transient int3) and, for
 * a trap splice, always. It runs with interrupts off in NMI-like context, so
 * it takes no lock: it binary-searches the published index.
 *
 *  - publish: the record is filled, then the index holding it is published
 *    (release), both before the int3 is written and synced, so a CPU that
 *    traps on our int3 finds the address with its patch;
 *  - unpublish: the index without the record is published only after the
 *    original bytes are back and every CPU has synced; that IPI cannot
 *    complete while a CPU is still in this handler, so no CPU looks at a
 *    record for an address that no longer traps;
 *  - re-point: patch changes with WRITE_ONCE; the old and new patch are both
 *    complete, and the old one stays entered (ki_entered), so it is not
 *    rewritten before an RCU-tasks grace period.
 *
 * Anything else (a user-mode int3, a kprobe, a stray int3) is not ours.
 */
static int ki_die_notify(struct notifier_block *nb, unsigned long val, void *data)
{
	struct die_args *args = data;
	struct pt_regs *regs = args->regs;
	const struct ki_index *idx;
	unsigned long ip;
	int lo, hi;

	if (val != DIE_INT3 || !regs || user_mode(regs))
		return NOTIFY_DONE;
	ip = regs->ip - 1;	/* int3 is one byte; ip is after it */
	idx = smp_load_acquire(&ki_live_idx);
	lo = 0;
	hi = READ_ONCE(idx->n);
	while (lo < hi) {
		int mid = lo + (hi - lo) / 2;
		unsigned long a = READ_ONCE(idx->addr[mid]);

		if (a == ip) {
			regs->ip = READ_ONCE(idx->rec[mid]->patch);
			atomic_inc(&ki_int3_hits);
			return NOTIFY_STOP;
		}
		if (a < ip)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NOTIFY_DONE;
}

static struct notifier_block ki_die_nb = {
	.notifier_call = ki_die_notify,
	.priority = INT_MAX,
};

/* ki_index_publish publishes a new index: the live one without the records
 * unspliced since (their addr is 0 now), merged with add[0..nadd), which is
 * sorted by address. A notifier that loaded the spare before it was retired
 * may still read it unless every CPU has synced since: sync first if not. */
static void ki_index_publish(struct ki_splice_rec *const *add, u32 nadd)
{
	const struct ki_index *live = ki_live_idx;
	struct ki_index *next = live == &ki_idx[0] ? &ki_idx[1] : &ki_idx[0];
	struct ki_splice_rec *r;
	int i = 0, n = 0;
	u32 j = 0;

	if (ki_spare_dirty)
		ki_sync_all();
	while (i < live->n || j < nadd) {
		if (i < live->n && live->rec[i]->addr != live->addr[i]) {
			i++;
			continue;
		}
		if (j == nadd || (i < live->n && live->addr[i] < add[j]->addr))
			r = live->rec[i++];
		else
			r = add[j++];
		next->addr[n] = r->addr;
		next->rec[n++] = r;
	}
	next->n = n;
	smp_store_release(&ki_live_idx, next);
	ki_spare_dirty = true;
}

/*
 * ki_hotplug keeps CPUs from coming online or going offline while any splice
 * is installed. A CPU coming online runs kernel code (cr4_init and the rest
 * of start_secondary before cpu_init) before it has loaded its IDT: an int3
 * there, a trap splice's or the transient one of a write, is a triple fault
 * and the machine resets. Found by arming 100,000 blocks in address order
 * (they reach arch/x86's early boot code) under a workload that takes a CPU
 * offline and back: QEMU exited right after "Booting Node 0 Processor 1".
 * cpu_hotplug_disable() waits for an operation in progress; a CPU offlined
 * or onlined meanwhile gets -EBUSY.
 */
static void ki_hotplug(u32 installed)
{
	if (installed && !ki_hotplug_off) {
		cpu_hotplug_disable();
		ki_hotplug_off = true;
	} else if (!installed && ki_hotplug_off) {
		cpu_hotplug_enable();
		ki_hotplug_off = false;
	}
}

/* ki_index_grow makes both index buffers hold cap entries: the spare is
 * reallocated once no notifier can be reading it, then published (a copy of
 * the live one), twice over. Publishing never allocates, so unsplicing
 * cannot fail for memory. */
static int ki_index_grow(int cap)
{
	int k;

	for (k = 0; k < 2; k++) {
		struct ki_index *spare = ki_live_idx == &ki_idx[0] ? &ki_idx[1] : &ki_idx[0];

		if (spare->cap < cap) {
			unsigned long *addr = kvmalloc_array(cap, sizeof(*addr), GFP_KERNEL);
			struct ki_splice_rec **rec = kvmalloc_array(cap, sizeof(*rec), GFP_KERNEL);

			if (!addr || !rec) {
				kvfree(addr);
				kvfree(rec);
				return -ENOMEM;
			}
			if (ki_spare_dirty)
				ki_sync_all();
			kvfree(spare->addr);
			kvfree(spare->rec);
			spare->addr = addr;
			spare->rec = rec;
			spare->cap = cap;
		}
		ki_index_publish(NULL, 0);
	}
	return 0;
}

/* ki_grow makes room for n more records: blocks of them, and index buffers
 * that hold them all. */
static int ki_grow(u32 n)
{
	u32 want = ki_nr_slots + (n > ki_nr_free ? n - ki_nr_free : 0);

	if (want > KI_MAX_SPLICES)
		return -ENOSPC;
	while (ki_nr_blocks * KI_REC_BLOCK < want) {
		struct ki_splice_rec *b = kvcalloc(KI_REC_BLOCK, sizeof(*b), GFP_KERNEL);

		if (!b)
			return -ENOMEM;
		ki_rec_blocks[ki_nr_blocks++] = b;
	}
	if (ki_idx[0].cap < ki_nr_blocks * KI_REC_BLOCK || ki_idx[1].cap < ki_nr_blocks * KI_REC_BLOCK)
		return ki_index_grow(ki_nr_blocks * KI_REC_BLOCK);
	return 0;
}

/* ki_index_find: the first entry of the live index at or above addr
 * (writers, under ki_lock). */
static int ki_index_find(unsigned long addr)
{
	const struct ki_index *idx = ki_live_idx;
	int lo = 0, hi = idx->n;

	while (lo < hi) {
		int mid = lo + (hi - lo) / 2;

		if (idx->addr[mid] < addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* ki_lookup: the installed splice at addr, or NULL. */
static struct ki_splice_rec *ki_lookup(unsigned long addr)
{
	int i = ki_index_find(addr);

	return i < ki_live_idx->n && ki_live_idx->addr[i] == addr ? ki_live_idx->rec[i] : NULL;
}

/* ki_overlaps: an installed splice overlaps [addr, addr+len). Splices never
 * overlap each other, so the last one starting below addr+len is the only
 * candidate. */
static bool ki_overlaps(unsigned long addr, u32 len)
{
	int i = ki_index_find(addr + len);

	return i > 0 && ki_live_idx->addr[i - 1] + ki_live_idx->rec[i - 1]->len > addr;
}

/* ---- patch heap ------------------------------------------------------ */

/* ki_heap_chunks: the chunks [*c0, *c1) that [addr, addr+len) touches;
 * false unless that range is non-empty and lies in the patch heap. */
static bool ki_heap_chunks(u64 addr, u64 len, u32 *c0, u32 *c1)
{
	u64 off = addr - (unsigned long)ki_patch_heap;

	if (addr < (unsigned long)ki_patch_heap || !len || off >= KI_HEAP_SIZE ||
	    len > KI_HEAP_SIZE - off)
		return false;
	*c0 = off / KI_CHUNK;
	*c1 = DIV_ROUND_UP(off + len, KI_CHUNK);
	return true;
}

/* ki_patch_chunks: the chunks [*c0, *c1) of the patch of a splice of kind:
 * none for KI_SHORT (its patch is a slot; len must be 0), else the patch
 * must start on a chunk and lie in the heap. */
static bool ki_patch_chunks(u64 patch, u64 len, int kind, u32 *c0, u32 *c1)
{
	*c0 = *c1 = 0;
	if (kind == KI_SHORT)
		return !len;
	return IS_ALIGNED(patch, KI_CHUNK) && ki_heap_chunks(patch, len, c0, c1);
}

/* ki_set_patch points r at patch, chunks [c0, c1), which become busy and
 * entered; its old chunks are busy no more (on its account). */
static void ki_set_patch(struct ki_splice_rec *r, u64 patch, u32 c0, u32 c1)
{
	u32 c;

	for (c = r->c0; c < r->c1; c++)
		ki_busy[c]--;
	WRITE_ONCE(r->patch, patch);
	r->c0 = c0;
	r->c1 = c1;
	for (c = c0; c < c1; c++)
		ki_busy[c]++;
	bitmap_set(ki_entered, c0, c1 - c0);
}

/*
 * ki_quiesce waits, if any chunk is entered, until no task can still be in
 * a patch no splice leads to any more: a task preempted in a patch resumes
 * there even after the splice is gone or re-pointed. synchronize_rcu_tasks()
 * returns once every task has passed through a voluntary context switch or
 * user mode. Then only the installed splices' patches are entered.
 */
static void ki_quiesce(void)
{
	u32 c;

	if (bitmap_empty(ki_entered, KI_NCHUNKS))
		return;
	synchronize_rcu_tasks();
	bitmap_zero(ki_entered, KI_NCHUNKS);
	for (c = 0; c < KI_NCHUNKS; c++)
		if (ki_busy[c])
			__set_bit(c, ki_entered);
}

/* ki_copy moves len bytes, a page at a time through a bounce buffer, from
 * kernel memory at kaddr to user buffer ubuf (to_user; a fault is -EFAULT,
 * never an oops), or from ubuf into the patch heap at kaddr. */
static long ki_copy(u64 kaddr, u64 ubuf, u64 len, bool to_user)
{
	u8 *buf = kmalloc(PAGE_SIZE, GFP_KERNEL);
	long err = 0;
	u64 done;

	if (!buf)
		return -ENOMEM;
	for (done = 0; !err && done < len; done += PAGE_SIZE) {
		size_t n = min_t(u64, len - done, PAGE_SIZE);
		void __user *u = u64_to_user_ptr(ubuf + done);

		if (to_user)
			err = copy_from_kernel_nofault(buf, (void *)(unsigned long)(kaddr + done), n) ||
			      copy_to_user(u, buf, n) ? -EFAULT : 0;
		else
			err = copy_from_user(buf, u, n) ? -EFAULT : ki_text_write(kaddr + done, buf, 0, n);
	}
	kfree(buf);
	return err;
}

/* ki_patch_write: see KI_IOC_PATCH_WRITE. */
static long ki_patch_write(void *arg)
{
	struct ki_patch_write *w = arg;
	u32 c, c0, c1;

	if (!ki_heap_chunks(w->addr, w->len, &c0, &c1))
		return -EINVAL;
	for (c = c0; c < c1; c++)
		if (ki_busy[c])
			return -EBUSY;	/* an installed splice leads there */
	/* Memory no splice sent CPUs into since the last wait has never run
	 * (or no task is left in it): no wait. */
	if (find_next_bit(ki_entered, c1, c0) < c1)
		ki_quiesce();
	return ki_copy(w->addr, w->buf, w->len, false);
}

/* ---- splicing -------------------------------------------------------- */

/* Scratch space of one batch, under ki_lock: the records, writes and jmps
 * of up to KI_BATCH_MAX splices. */
struct ki_op {
	struct ki_splice *s;
	u32 c0, c1;
	int kind;
};
static struct ki_op ki_ops[KI_BATCH_MAX];
static struct ki_splice_rec *ki_recs[KI_BATCH_MAX];
static struct ki_poke ki_pokes[KI_BATCH_MAX];
static u8 ki_jmps[KI_BATCH_MAX][KI_JMP32_LEN];
static const u8 ki_int3[1] = { KI_INT3 };

/* ki_find_id: the installed splice with id, or NULL. */
static struct ki_splice_rec *ki_find_id(u32 id)
{
	u32 i = id & (KI_MAX_SPLICES - 1);
	struct ki_splice_rec *r;

	if (!id || i >= ki_nr_slots)
		return NULL;
	r = ki_rec(i);
	return r->addr && r->id == id ? r : NULL;
}

/* ki_unpublish takes n installed splices whose original bytes are back (or
 * were never replaced) out of the index and frees their records. Their
 * patches stay entered. */
static void ki_unpublish(struct ki_splice_rec *const *recs, u32 n)
{
	u32 i;

	for (i = 0; i < n; i++) {
		struct ki_splice_rec *r = recs[i];

		pr_debug("kerninst: unsplice %u at %pS\n", r->id, (void *)r->addr);
		ki_set_patch(r, r->patch, 0, 0);
		if (r->slot)
			r->slot->users--;
		r->slot = NULL;
		r->addr = 0;
		r->pending = 0;
		ki_nr_splices--;
	}
	/* see ki_die_notify: no CPU can still trap on these addresses */
	ki_index_publish(NULL, 0);
	ki_hotplug(ki_nr_splices);
	for (i = 0; i < n; i++) {
		recs[i]->next_free = ki_free_head;
		ki_free_head = recs[i]->id & (KI_MAX_SPLICES - 1);
		ki_nr_free++;
	}
}

/* ki_restore_many puts back the original bytes of n (<= KI_BATCH_MAX)
 * installed splices in one round, then unpublishes them. */
static int ki_restore_many(struct ki_splice_rec *const *recs, u32 n)
{
	u32 i;
	int err;

	for (i = 0; i < n; i++)
		ki_pokes[i] = (struct ki_poke){ .addr = recs[i]->addr, .bytes = recs[i]->orig,
						.len = recs[i]->len };
	err = ki_poke_many(ki_pokes, n);
	if (!err)
		ki_unpublish(recs, n);
	return err;
}

/* ki_splice_kind checks the replacement bytes against the patch and says
 * what kind of splice they make, or -EINVAL. */
static int ki_splice_kind(const struct ki_splice *s)
{
	const struct ki_splice_rec *slot;

	if (s->flags & ~(KI_SPLICE_SLOT | KI_SPLICE_COVER) ||
	    (s->flags & KI_SPLICE_SLOT && s->flags & KI_SPLICE_COVER))
		return -EINVAL;
	if (s->len == KI_JMP32_LEN && s->new[0] == KI_JMP32) {
		s64 rel = (s32)get_unaligned_le32(&s->new[1]);

		if (s->addr + KI_JMP32_LEN + rel != s->patch)
			return -EINVAL;
		return s->flags & KI_SPLICE_SLOT ? KI_SLOT : KI_DIRECT;
	}
	if (s->flags)
		return -EINVAL;
	if (s->len == 1 && s->new[0] == KI_INT3)
		return KI_TRAP;
	/* a jmp rel8 must land on an installed slot */
	slot = ki_lookup(s->patch);
	if (s->len == KI_JMP8_LEN && s->new[0] == KI_JMP8 &&
	    s->addr + KI_JMP8_LEN + (s8)s->new[1] == s->patch && slot && slot->kind == KI_SLOT)
		return KI_SHORT;
	return -EINVAL;
}

/* ki_splice_check checks one splice against the kernel and the installed
 * splices (not against the rest of its batch); see KI_IOC_SPLICE. */
static int ki_splice_check(struct ki_op *op)
{
	const struct ki_splice *s = op->s;
	u8 cur[KI_MAX_INSN];

	if (s->len < 1 || s->len > KI_MAX_INSN)
		return -EINVAL;
	op->kind = ki_splice_kind(s);
	if (op->kind < 0 || !ki_patch_chunks(s->patch, s->patch_len, op->kind, &op->c0, &op->c1))
		return -EINVAL;
	if (!ki_spliceable(s->addr, s->len))
		return -EPERM;
	if (ki_overlaps(s->addr, s->len))
		return -EEXIST;
	if (copy_from_kernel_nofault(cur, (void *)(unsigned long)s->addr, s->len))
		return -EFAULT;
	if (memcmp(cur, s->orig, s->len))
		return -ESTALE;
	if (cur[0] == KI_INT3 && op->kind != KI_SLOT)
		return -EBUSY;
	return 0;
}

static int ki_op_cmp(const void *a, const void *b)
{
	unsigned long x = ((const struct ki_op *)a)->s->addr, y = ((const struct ki_op *)b)->s->addr;

	return x < y ? -1 : x > y;
}

/* ki_take_rec: a free record, with a fresh id; ki_grow made room. */
static struct ki_splice_rec *ki_take_rec(void)
{
	u32 i;
	struct ki_splice_rec *r;

	if (ki_nr_free) {
		i = ki_free_head;
		ki_free_head = ki_rec(i)->next_free;
		ki_nr_free--;
	} else {
		i = ki_nr_slots++;
	}
	r = ki_rec(i);

	r->id = ki_next_seq << KI_ID_SHIFT | i;
	ki_next_seq = (ki_next_seq + 1) & (U32_MAX >> KI_ID_SHIFT);
	if (!ki_next_seq)
		ki_next_seq = 1;
	return r;
}

/*
 * ki_splice_many installs splices s[0..n), n <= KI_BATCH_MAX, all or none:
 * every one is checked first (*failed: the index of a refused one; n if
 * none was), then all are published, then written in one round of
 * ki_poke_many. Errors: -EINVAL malformed request, patch not in the heap,
 * or a jmp rel8 not to a slot; -EPERM addr is not spliceable text; -EEXIST
 * overlaps an installed splice or another of the batch; -EBUSY the first
 * byte is already an int3 (someone else's breakpoint; padding under a slot
 * may be int3); -ESTALE the bytes at addr are not orig; -ENOSPC too many
 * splices.
 */
static int ki_splice_many(struct ki_splice *s, u32 n, u32 *failed)
{
	u32 i, room = ki_nr_free + (KI_MAX_SPLICES - ki_nr_slots);
	int err;

	*failed = n;
	for (i = 0; i < n; i++) {
		ki_ops[i] = (struct ki_op){ .s = &s[i] };
		err = ki_splice_check(&ki_ops[i]);
		if (err) {
			*failed = i;
			return err;
		}
	}
	sort(ki_ops, n, sizeof(ki_ops[0]), ki_op_cmp, NULL);
	for (i = 1; i < n; i++) {
		if (ki_ops[i - 1].s->addr + ki_ops[i - 1].s->len > ki_ops[i].s->addr) {
			*failed = ki_ops[i].s - s;
			return -EEXIST;
		}
	}
	if (n > room) {
		*failed = room;
		return -ENOSPC;
	}
	err = ki_grow(n);
	if (err)
		return err;
	/* before the first int3 is written (ki_nr_splices counts them below) */
	ki_hotplug(ki_nr_splices + n);
	/* Publish before writing: the notifier must know where to send a CPU
	 * that hits an int3 written first. */
	for (i = 0; i < n; i++) {
		struct ki_op *op = &ki_ops[i];
		struct ki_splice_rec *r = ki_take_rec();

		ki_set_patch(r, op->s->patch, op->c0, op->c1);
		r->len = op->s->len;
		r->kind = op->kind;
		memcpy(r->orig, op->s->orig, r->len);
		/* A covering splice is armed as a trap splice: int3 only (the
		 * notifier sends CPUs to the patch); KI_IOC_COVER_FINISH
		 * writes the jmp once no task can be stopped inside the
		 * covered bytes. */
		r->pending = op->s->flags & KI_SPLICE_COVER ? ++ki_cover_seq : 0;
		r->slot = op->kind == KI_SHORT ? ki_lookup(op->s->patch) : NULL;
		if (r->slot)
			r->slot->users++;
		r->addr = op->s->addr;
		ki_nr_splices++;
		ki_recs[i] = r;
		ki_pokes[i] = (struct ki_poke){ .addr = r->addr, .bytes = r->pending ? ki_int3 : op->s->new,
						.len = r->pending ? 1 : r->len };
	}
	ki_index_publish(ki_recs, n);
	err = ki_poke_many(ki_pokes, n);
	if (err) {
		/* nothing was written: take them back out */
		pr_warn("kerninst: splicing %u site(s) failed (%d)\n", n, err);
		ki_unpublish(ki_recs, n);	/* ki_hotplug: on again if none is left */
		return err;
	}
	for (i = 0; i < n; i++) {
		ki_ops[i].s->id = ki_recs[i]->id;
		pr_debug("kerninst: splice %u at %pS -> %px (%u bytes, kind %d)\n", ki_recs[i]->id,
			 (void *)ki_recs[i]->addr, (void *)ki_recs[i]->patch, ki_recs[i]->len, ki_recs[i]->kind);
	}
	return 0;
}

/*
 * ki_unsplice_many restores splices ids[0..n), n <= KI_BATCH_MAX, all or
 * none, in one round: every id is checked first (*failed: the index of a
 * refused one; n if none was). Errors: -ENOENT unknown id; -EINVAL an id
 * twice; -EBUSY a slot that springboard splices still jump to.
 */
static int ki_unsplice_many(const u32 *ids, u32 n, u32 *failed)
{
	u32 i, j;
	int err = 0;

	*failed = n;
	for (i = 0; i < n; i++) {
		struct ki_splice_rec *r = ki_find_id(ids[i]);

		if (!r)
			err = -ENOENT;
		else if (r->kind == KI_SLOT && r->users)
			err = -EBUSY;
		else if (r->marked)
			err = -EINVAL;
		if (err) {
			*failed = i;
			break;
		}
		r->marked = true;
		ki_recs[i] = r;
	}
	for (j = 0; j < i; j++)
		ki_recs[j]->marked = false;
	return err ? err : ki_restore_many(ki_recs, n);
}

/* ki_splice: see KI_IOC_SPLICE. */
static long ki_splice(void *arg)
{
	u32 failed;

	return ki_splice_many(arg, 1, &failed);
}

/* ki_splice_undo: the caller cannot learn the id: take the splice back out. */
static void ki_splice_undo(void *arg)
{
	u32 failed;

	ki_unsplice_many(&((struct ki_splice *)arg)->id, 1, &failed);
}

static long ki_unsplice(void *arg)
{
	u32 failed;

	return ki_unsplice_many(&((struct ki_unsplice *)arg)->id, 1, &failed);
}

/* ki_splice_batch: see KI_IOC_SPLICE_BATCH. */
static long ki_splice_batch(void *arg)
{
	struct ki_batch *b = arg;
	struct ki_splice *s;
	long err;
	u32 i;

	if (!b->n || b->n > KI_BATCH_MAX)
		return -EINVAL;
	s = kvmalloc_array(b->n, sizeof(*s), GFP_KERNEL);
	if (!s)
		return -ENOMEM;
	err = copy_from_user(s, u64_to_user_ptr(b->ops), b->n * sizeof(*s)) ? -EFAULT :
		ki_splice_many(s, b->n, &b->failed);
	if (!err && copy_to_user(u64_to_user_ptr(b->ops), s, b->n * sizeof(*s))) {
		/* the caller cannot learn the ids: take them back out */
		for (i = 0; i < b->n; i++)
			ki_recs[i] = ki_find_id(s[i].id);
		ki_restore_many(ki_recs, b->n);
		err = -EFAULT;
	}
	kvfree(s);
	return err;
}

/* ki_unsplice_batch: see KI_IOC_UNSPLICE_BATCH. */
static long ki_unsplice_batch(void *arg)
{
	struct ki_batch *b = arg;
	u32 *ids;
	long err;

	if (!b->n || b->n > KI_BATCH_MAX)
		return -EINVAL;
	ids = kvmalloc_array(b->n, sizeof(*ids), GFP_KERNEL);
	if (!ids)
		return -ENOMEM;
	err = copy_from_user(ids, u64_to_user_ptr(b->ops), b->n * sizeof(*ids)) ? -EFAULT :
		ki_unsplice_many(ids, b->n, &b->failed);
	kvfree(ids);
	return err;
}

/* ki_resplice points splice id at another patch (see KI_IOC_RESPLICE).
 * Errors: -ENOENT unknown id; -EINVAL a springboard splice (re-point its
 * slot), or patch not in the heap; -ERANGE patch out of rel32 reach. */
static long ki_resplice(void *arg)
{
	struct ki_resplice *rs = arg;
	struct ki_splice_rec *r = ki_find_id(rs->id);
	u8 jmp[KI_JMP32_LEN];
	bool same;
	u32 c0, c1;
	int err;

	if (!r)
		return -ENOENT;
	if (r->kind == KI_SHORT || !ki_patch_chunks(rs->patch, rs->patch_len, r->kind, &c0, &c1))
		return -EINVAL;
	err = ki_jmp32(jmp, r->addr, rs->patch);
	if (err && r->kind != KI_TRAP)
		return err;
	/* A CPU that hits the transient int3 goes to the new patch. */
	same = rs->patch == r->patch;
	ki_set_patch(r, rs->patch, c0, c1);
	if (same || r->kind == KI_TRAP || r->pending)	/* only the int3 is there */
		return 0;
	err = ki_poke(r->addr, jmp, KI_JMP32_LEN);
	if (err)
		pr_err("kerninst: re-pointing %pS failed (%d)\n", (void *)r->addr, err);
	return err;
}

/* ki_cover_write writes the jmps of n armed covering splices (ki_recs,
 * ki_pokes) in one round. */
static int ki_cover_write(u32 n)
{
	int err = ki_poke_many(ki_pokes, n);
	u32 i;

	if (err) {
		pr_err("kerninst: writing %u covering splice(s) failed (%d)\n", n, err);
		return err;
	}
	for (i = 0; i < n; i++)
		ki_recs[i]->pending = 0;
	return 0;
}

/* ki_cover_finish writes the jmp of every covering splice armed before it
 * was called (KI_IOC_COVER_FINISH), waiting without ki_lock, so other
 * requests go on. Records unspliced meanwhile are skipped (pending is 0 for
 * a freed record, and a reused one has a later sequence). */
static long ki_cover_finish(void *arg)
{
	struct ki_cover_finish *f = arg;
	struct ki_splice_rec *r;
	int err = 0;
	u32 n = 0, i;
	u64 upto;

	mutex_lock(&ki_lock);
	upto = ki_cover_seq;
	mutex_unlock(&ki_lock);
	/* Every task between the covered instructions when their int3 was
	 * written has since passed a voluntary context switch: it left. */
	synchronize_rcu_tasks();
	mutex_lock(&ki_lock);
	ki_for_each(r, i) {
		if (!r->pending || r->pending > upto)
			continue;
		/* in reach: checked when armed and when re-pointed */
		err = ki_jmp32(ki_jmps[n], r->addr, r->patch);
		if (err)
			break;
		ki_recs[n] = r;
		ki_pokes[n] = (struct ki_poke){ .addr = r->addr, .bytes = ki_jmps[n], .len = KI_JMP32_LEN };
		if (++n == KI_BATCH_MAX) {
			err = ki_cover_write(n);
			if (err)
				break;
			f->done += n;
			n = 0;
		}
	}
	if (!err && n) {
		err = ki_cover_write(n);
		if (!err)
			f->done += n;
	}
	mutex_unlock(&ki_lock);
	return err;
}

/* ki_restore_in restores every installed splice in the text of mod (every
 * splice if mod is NULL), springboard splices before the slots they jump
 * to, a batch at a time, and returns how many are left (failed, or a slot
 * still jumped to). */
static int ki_restore_in(const struct module *mod)
{
	unsigned long size = 0, base = mod ? ki_mod_text(mod, &size) : 0;
	unsigned long end = mod ? base + size : ULONG_MAX;
	struct ki_splice_rec *r;
	int pass, left = 0;
	u32 n, i;

	for (pass = 0; pass < 2; pass++) {
		n = 0;
		ki_for_each(r, i) {
			if ((r->kind == KI_SHORT) != !pass || r->addr < base || r->addr >= end)
				continue;
			if (r->kind == KI_SLOT && r->users) {
				left++;
				continue;
			}
			if (mod)
				pr_info("kerninst: module %s is unloading; removing splice %u at %pS\n",
					mod->name, r->id, (void *)r->addr);
			ki_recs[n++] = r;
			if (n == KI_BATCH_MAX) {
				if (ki_restore_many(ki_recs, n))
					left += n;
				n = 0;
			}
		}
		if (n && ki_restore_many(ki_recs, n))
			left += n;
	}
	return left;
}

/* ki_restore_all restores every splice, waits until no task can be in a
 * patch and refills the heap with int3; false (the heap left alone, so the
 * splices left keep working) if some splice could not be restored. */
static bool ki_restore_all(void)
{
	int tries;

	for (tries = 0; ki_restore_in(NULL); tries++) {
		if (tries == KI_RETRIES) {
			pr_err("kerninst: cannot restore every splice; %u left installed\n",
			       ki_nr_splices);
			return false;
		}
		msleep(10);
	}
	ki_quiesce();
	if (ki_text_write((unsigned long)ki_patch_heap, NULL, KI_INT3, KI_HEAP_SIZE))
		pr_err("kerninst: cannot refill the patch heap with int3\n");
	return true;
}

/* ki_tables_shrink gives back the records and the index buffers once no
 * splice is installed and the owner is gone: a whole-kernel session grew
 * them to about 70 MB. The index published first is empty, and every CPU
 * has synced since the other buffer was retired, so no notifier reads
 * either buffer's arrays (one that loads the empty index reads n = 0). */
static void ki_tables_shrink(void)
{
	u32 i;

	if (ki_nr_splices || !ki_nr_blocks)
		return;
	ki_index_publish(NULL, 0);
	ki_sync_all();
	for (i = 0; i < 2; i++) {
		kvfree(ki_idx[i].addr);
		kvfree(ki_idx[i].rec);
		ki_idx[i].addr = NULL;
		ki_idx[i].rec = NULL;
		ki_idx[i].cap = 0;
		WRITE_ONCE(ki_idx[i].n, 0);
	}
	for (i = 0; i < ki_nr_blocks; i++)
		kvfree(ki_rec_blocks[i]);
	ki_nr_blocks = ki_nr_slots = ki_nr_free = ki_free_head = 0;
}

/* ki_module_notify: a module is going away (rmmod, or a failed load); its
 * memory is freed next. Put its bytes back now, so that no later unsplice or
 * release writes into freed (maybe reused) pages. The owner's ids for these
 * splices become unknown (-ENOENT). */
static int ki_module_notify(struct notifier_block *nb, unsigned long action, void *data)
{
	struct module *mod = data;

	if (action != MODULE_STATE_GOING || mod == THIS_MODULE)
		return NOTIFY_DONE;
	mutex_lock(&ki_lock);
	if (ki_restore_in(mod))
		pr_err("kerninst: cannot restore every splice in going module %s\n", mod->name);
	mutex_unlock(&ki_lock);
	return NOTIFY_DONE;
}

static struct notifier_block ki_module_nb = {
	.notifier_call = ki_module_notify,
};

/* ---- the device ------------------------------------------------------ */

static long ki_read(void *arg)
{
	struct ki_read *r = arg;

	if (!r->len || r->len > KI_MAX_READ)
		return -EINVAL;
	if (r->addr + r->len < r->addr)
		return -EFAULT;
	return ki_copy(r->addr, r->buf, r->len, true);
}

static long ki_info(void *arg)
{
	unsigned long text_size, text = ki_mod_text(THIS_MODULE, &text_size);

	*(struct ki_info *)arg = (struct ki_info){
		.abi_version = KI_ABI_VERSION,
		.chunk_size = KI_CHUNK,
		.patch_heap = (unsigned long)ki_patch_heap,
		.patch_heap_size = KI_HEAP_SIZE,
		.counter_heap = (unsigned long)ki_counters,
		.counter_heap_size = KI_COUNTER_SIZE,
		.module_text = text,
		.module_text_size = text_size,
		.nr_splices = ki_nr_splices,
		.int3_hits = atomic_read(&ki_int3_hits),
		.syncs = ki_syncs,
		.max_splices = KI_MAX_SPLICES,
		.batch_max = KI_BATCH_MAX,
	};
	return 0;
}

static long ki_counters_clear(void *arg)
{
	struct ki_counters_clear *c = arg;
	u32 i;

	if (c->first >= ARRAY_SIZE(ki_counters) || c->count > ARRAY_SIZE(ki_counters) - c->first)
		return -EINVAL;
	for (i = 0; i < c->count; i++)
		WRITE_ONCE(ki_counters[c->first + i], 0);
	return 0;
}

/* The ioctls. A command carries its argument's size and direction: ki_ioctl
 * copies the argument in before the handler and out once it succeeded; undo
 * takes back a result the caller cannot be told. Handlers run under ki_lock
 * unless they take it themselves. */
static const struct ki_ioctl_op {
	unsigned int cmd;
	long (*fn)(void *arg);
	void (*undo)(void *arg);
	bool takes_lock;
	bool out_on_error;	/* copy the argument out on failure too */
} ki_ioctl_ops[] = {
	{ KI_IOC_INFO, ki_info },
	{ KI_IOC_READ, ki_read },
	{ KI_IOC_PATCH_WRITE, ki_patch_write },
	{ KI_IOC_SPLICE, ki_splice, ki_splice_undo },
	{ KI_IOC_UNSPLICE, ki_unsplice },
	{ KI_IOC_COUNTERS_CLEAR, ki_counters_clear },
	{ KI_IOC_RESPLICE, ki_resplice },
	{ KI_IOC_COVER_FINISH, ki_cover_finish, NULL, true },	/* not across its wait */
	{ KI_IOC_SPLICE_BATCH, ki_splice_batch, NULL, false, true },
	{ KI_IOC_UNSPLICE_BATCH, ki_unsplice_batch, NULL, false, true },
};

static long ki_ioctl(struct file *f, unsigned int cmd, unsigned long arg)
{
	void __user *uarg = (void __user *)arg;
	const struct ki_ioctl_op *op = ki_ioctl_ops, *end = op + ARRAY_SIZE(ki_ioctl_ops);
	size_t size = _IOC_SIZE(cmd);
	u64 a[16];	/* the largest argument: struct ki_info */
	long ret;

	if (!capable(CAP_SYS_ADMIN))
		return -EPERM;
	while (op < end && op->cmd != cmd)
		op++;
	if (op == end || size > sizeof(a))
		return -ENOTTY;
	memset(a, 0, sizeof(a));
	if (_IOC_DIR(cmd) & _IOC_WRITE && copy_from_user(a, uarg, size))
		return -EFAULT;
	if (!op->takes_lock)
		mutex_lock(&ki_lock);
	ret = op->fn(a);
	if ((!ret || op->out_on_error) && _IOC_DIR(cmd) & _IOC_READ && copy_to_user(uarg, a, size) && !ret) {
		if (op->undo)
			op->undo(a);
		ret = -EFAULT;
	}
	if (!op->takes_lock)
		mutex_unlock(&ki_lock);
	return ret;
}

/* ki_mmap maps the counter heap read-only: offset 0, at most its size. */
static int ki_mmap(struct file *f, struct vm_area_struct *vma)
{
	unsigned long size = vma->vm_end - vma->vm_start, off;
	int err;

	if (vma->vm_pgoff || size > KI_COUNTER_SIZE)
		return -EINVAL;
	if (vma->vm_flags & (VM_WRITE | VM_EXEC))
		return -EPERM;
	ki_vma_flags(vma, VM_DONTEXPAND | VM_DONTDUMP, VM_MAYWRITE | VM_MAYEXEC);
	for (off = 0; off < size; off += PAGE_SIZE) {
		struct page *pg = vmalloc_to_page((u8 *)ki_counters + off);

		if (!pg)
			return -EFAULT;
		err = remap_pfn_range(vma, vma->vm_start + off, page_to_pfn(pg), PAGE_SIZE,
				      vma->vm_page_prot);
		if (err)
			return err;
	}
	return 0;
}

static int ki_open(struct inode *inode, struct file *f)
{
	if (!capable(CAP_SYS_ADMIN))
		return -EPERM;
	if (atomic_cmpxchg(&ki_is_open, 0, 1))
		return -EBUSY;
	memset(ki_counters, 0, sizeof(ki_counters));
	return 0;
}

/* ki_release: the owner is gone (closed, exited or killed). Put the kernel
 * back as it was, then let the next owner in. */
static int ki_release(struct inode *inode, struct file *f)
{
	mutex_lock(&ki_lock);
	if (ki_nr_splices)
		pr_info("kerninst: device closed with %u splice(s) installed; restoring\n",
			ki_nr_splices);
	if (ki_restore_all())
		ki_tables_shrink();
	mutex_unlock(&ki_lock);
	atomic_set(&ki_is_open, 0);
	return 0;
}

static const struct file_operations ki_fops = {
	.owner = THIS_MODULE,
	.open = ki_open,
	.release = ki_release,
	.unlocked_ioctl = ki_ioctl,
	.mmap = ki_mmap,
	.llseek = noop_llseek,
};

static struct miscdevice ki_dev = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "kerninst",
	.fops = &ki_fops,
	.mode = 0600,
};

static int __init ki_init(void)
{
	int err;

	BUILD_BUG_ON(sizeof(struct ki_info) != 80 || sizeof(struct ki_splice) != 64 ||
		     sizeof(struct ki_resplice) != 16 || sizeof(struct ki_cover_finish) != 8 ||
		     sizeof(struct ki_batch) != 16);
	err = ki_tables_alloc();
	if (err)
		return err;
	/* The heap is NOBITS, zeroed by the loader: int3 before any use. */
	err = ki_text_write((unsigned long)ki_patch_heap, NULL, KI_INT3, KI_HEAP_SIZE);
	if (err)
		goto out_tables;
	err = register_die_notifier(&ki_die_nb);
	if (err)
		goto out_tables;
	err = register_module_notifier(&ki_module_nb);
	if (err)
		goto out_die;
	err = misc_register(&ki_dev);
	if (err)
		goto out_module;
	pr_info("kerninst: patch heap %px (%d KiB), counter heap %px (%d KiB)\n",
		ki_patch_heap, KI_HEAP_SIZE >> 10, ki_counters, KI_COUNTER_SIZE >> 10);
	return 0;

out_module:
	unregister_module_notifier(&ki_module_nb);
out_die:
	unregister_die_notifier(&ki_die_nb);
out_tables:
	ki_tables_free();
	return err;
}

/* ki_exit: no new opens, restore anything left (unreachable: an open or
 * mapped device pins the module), and only then drop the notifiers: the int3
 * one must outlive every transient int3 of a restore, and unregistering it
 * waits until no CPU is running ki_die_notify. */
static void __exit ki_exit(void)
{
	misc_deregister(&ki_dev);
	mutex_lock(&ki_lock);
	if (ki_nr_splices)
		ki_restore_all();
	mutex_unlock(&ki_lock);
	unregister_module_notifier(&ki_module_nb);
	unregister_die_notifier(&ki_die_nb);
	ki_tables_free();
}

module_init(ki_init);
module_exit(ki_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("kinst: splice instrumentation into the running kernel");
