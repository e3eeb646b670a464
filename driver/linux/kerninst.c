// SPDX-License-Identifier: GPL-2.0
// Go tooling: this file is kernel C, embedded by embed.go, never built by cgo.
//go:build ignore

/*
 * kerninst.ko: the kernel half of kinst.
 *
 * It only does what needs kernel context — read kernel memory, write the
 * patch heap through a temporary alias, splice and unsplice one instruction
 * with the text_poke_bp protocol, redirect int3 hits to patches — and checks
 * every argument it is given. What to splice, and the code in the patches,
 * is decided by kerninstd.
 *
 * Locking: ki_lock (a mutex) serialises every ioctl, release and the
 * fields marked [ki_lock] below. The int3 notifier runs in NMI-like
 * context and reads ki_splices[] lock-free (see ki_die_notify).
 */
#include <linux/module.h>
#include <linux/miscdevice.h>
#include <linux/fs.h>
#include <linux/uaccess.h>
#include <linux/mm.h>
#include <linux/vmalloc.h>
#include <linux/slab.h>
#include <linux/mutex.h>
#include <linux/kdebug.h>
#include <linux/smp.h>
#include <linux/rcupdate.h>
#include <linux/stringify.h>
#include <asm/sync_core.h>
#include <asm/pgtable.h>
#include <asm/set_memory.h>
#include <asm/unaligned.h>

#include "kerninst_uapi.h"

#define KI_HEAP_SIZE	(1 << 20)
#define KI_CHUNK	64
#define KI_NCHUNKS	(KI_HEAP_SIZE / KI_CHUNK)
#define KI_COUNTER_SIZE	(64 << 10)
#define KI_MAX_SPLICES	4096
#define KI_MAX_READ	(1 << 20)
#define KI_MAX_PATCH	(64 << 10)
#define KI_INT3		0xcc
#define KI_JMP32	0xe9

/*
 * The patch heap: executable bytes in this module's own text, so it lies
 * in the module area within rel32 reach of kernel text. The module loader
 * maps it read-only and executable; it is written only through a
 * temporary writable alias (ki_text_write), never by lifting write
 * protection. It is filled with int3 so a stray jump traps.
 */
asm(".pushsection .text.kinst_heap,\"ax\",@progbits\n"
    ".balign 4096\n"
    ".globl ki_patch_heap\n"
    "ki_patch_heap:\n"
    ".fill " __stringify(KI_HEAP_SIZE) ",1,0xcc\n"
    ".popsection\n");
extern u8 ki_patch_heap[];

/* The counter heap: patches bump slots with lock incq; mmap'ed read-only. */
static u64 ki_counters[KI_COUNTER_SIZE / sizeof(u64)] __aligned(PAGE_SIZE);

struct ki_splice_rec {
	unsigned long addr;	/* 0 when the slot is free; read lock-free */
	unsigned long patch;	/* where an int3 hit at addr is sent */
	u32 id;
	u32 len;
	u8 orig[16];
};

static DEFINE_MUTEX(ki_lock);
static struct ki_splice_rec ki_splices[KI_MAX_SPLICES];	/* [ki_lock] for writers */
static int ki_nr_hw;		/* slots ever used: the notifier scans [0, ki_nr_hw) */
static u32 ki_nr_splices;	/* [ki_lock] installed splices */
static u32 ki_next_id = 1;	/* [ki_lock] */
static bool ki_need_tasks_gp;	/* [ki_lock] a splice was removed since the last RCU-tasks wait */
/* [ki_lock] patch heap allocator: per chunk, 1 + the allocation's first chunk (0: free) */
static u32 ki_owner[KI_NCHUNKS];
static u32 ki_alloc_len[KI_NCHUNKS];	/* [ki_lock] chunks, at an allocation's first chunk */
static bool ki_alloc_spliced[KI_NCHUNKS]; /* [ki_lock] a splice has targeted it */
static atomic_t ki_is_open = ATOMIC_INIT(0);
static atomic_t ki_int3_hits = ATOMIC_INIT(0);	/* redirects by ki_die_notify */

/* ---- text access ---------------------------------------------------- */

/* ki_is_text: [addr, addr+len) is mapped executable kernel memory. */
static bool ki_is_text(unsigned long addr, size_t len)
{
	unsigned long a;
	unsigned int level;
	pte_t *pte;

	if (addr < TASK_SIZE_MAX || addr + len < addr)
		return false;
	for (a = addr & PAGE_MASK; a < addr + len; a += PAGE_SIZE) {
		pte = lookup_address(a, &level);
		if (!pte || !pte_present(*pte) || !pte_exec(*pte))
			return false;
	}
	return true;
}

static bool ki_in_own_module(unsigned long addr, size_t len)
{
	unsigned long base = (unsigned long)THIS_MODULE->core_layout.base;
	unsigned long end = base + THIS_MODULE->core_layout.size;

	return addr < end && addr + len > base;
}

static bool ki_in_heap(unsigned long addr, size_t len)
{
	unsigned long h = (unsigned long)ki_patch_heap;

	return addr >= h && len <= KI_HEAP_SIZE && addr - h <= KI_HEAP_SIZE - len;
}

/*
 * ki_text_write writes text through a temporary writable alias of the
 * physical page(s): the text mapping itself stays read-only.
 */
static int ki_text_write(unsigned long addr, const void *src, size_t len)
{
	while (len) {
		size_t off = addr & ~PAGE_MASK;
		size_t n = min_t(size_t, len, PAGE_SIZE - off);
		struct page *pg = pfn_to_page(slow_virt_to_phys((void *)addr) >> PAGE_SHIFT);
		void *map = vmap(&pg, 1, VM_MAP, PAGE_KERNEL);

		if (!map)
			return -ENOMEM;
		memcpy(map + off, src, n);
		vunmap(map);
		addr += n;
		src += n;
		len -= n;
	}
	return 0;
}

static void ki_do_sync_core(void *unused)
{
	sync_core();
}

/* Every CPU executes a serialising instruction: no stale prefetched text. */
static void ki_sync_all(void)
{
	on_each_cpu(ki_do_sync_core, NULL, 1);
}

/*
 * ki_poke overwrites one instruction's first len bytes as text_poke_bp
 * does: int3 first, so a CPU racing with the write traps (and is sent to
 * the patch by ki_die_notify) instead of executing a torn instruction.
 */
static int ki_poke(unsigned long addr, const u8 *bytes, u32 len)
{
	u8 int3 = KI_INT3;
	int err;

	err = ki_text_write(addr, &int3, 1);
	if (err)
		return err;
	ki_sync_all();
	if (len > 1) {
		err = ki_text_write(addr + 1, bytes + 1, len - 1);
		ki_sync_all();
		if (err)
			return err;
	}
	err = ki_text_write(addr, bytes, 1);
	ki_sync_all();
	return err;
}

/* ---- int3 redirection ------------------------------------------------ */

/*
 * ki_die_notify sends a CPU that hit the int3 of a splice to its patch.
 * It runs with interrupts off in NMI-like context: no locks. A slot's patch
 * is written before its addr (smp_wmb), and a slot is only cleared after
 * its bytes are restored and every CPU has synced — an IPI that cannot
 * complete while any CPU is still inside this handler — so a matching addr
 * always comes with its own patch.
 */
static int ki_die_notify(struct notifier_block *nb, unsigned long val, void *data)
{
	struct die_args *args = data;
	struct pt_regs *regs = args->regs;
	unsigned long ip;
	int i, n;

	if (val != DIE_INT3 || !regs || user_mode(regs))
		return NOTIFY_DONE;
	ip = regs->ip - 1;
	n = READ_ONCE(ki_nr_hw);
	for (i = 0; i < n; i++) {
		if (READ_ONCE(ki_splices[i].addr) == ip) {
			smp_rmb();
			regs->ip = READ_ONCE(ki_splices[i].patch);
			atomic_inc(&ki_int3_hits);
			return NOTIFY_STOP;
		}
	}
	return NOTIFY_DONE;
}

static struct notifier_block ki_die_nb = {
	.notifier_call = ki_die_notify,
	.priority = INT_MAX,
};

/* ---- patch heap ------------------------------------------------------ */

static unsigned long ki_chunk_addr(u32 c)
{
	return (unsigned long)ki_patch_heap + (unsigned long)c * KI_CHUNK;
}

/* ki_alloc_of returns the first chunk of the allocation holding [addr,
 * addr+len), or -1. */
static long ki_alloc_of(unsigned long addr, size_t len)
{
	u32 c, first;

	if (!len || !ki_in_heap(addr, len))
		return -1;
	c = (addr - (unsigned long)ki_patch_heap) / KI_CHUNK;
	if (!ki_owner[c])
		return -1;
	first = ki_owner[c] - 1;
	if (addr + len > ki_chunk_addr(first + ki_alloc_len[first]))
		return -1;
	return first;
}

/* ki_alloc_busy: an installed splice sends CPUs into allocation first. */
static bool ki_alloc_busy(u32 first)
{
	unsigned long lo = ki_chunk_addr(first), hi = ki_chunk_addr(first + ki_alloc_len[first]);
	int i;

	for (i = 0; i < ki_nr_hw; i++)
		if (ki_splices[i].addr && ki_splices[i].patch >= lo && ki_splices[i].patch < hi)
			return true;
	return false;
}

/* ki_quiesce waits until no task can still be running in a removed patch. */
static void ki_quiesce(void)
{
	if (ki_need_tasks_gp) {
		synchronize_rcu_tasks();
		ki_need_tasks_gp = false;
	}
}

static int ki_fill_int3(unsigned long addr, size_t len)
{
	static u8 int3s[KI_CHUNK * 16];
	int err;

	if (!int3s[0])
		memset(int3s, KI_INT3, sizeof(int3s));
	while (len) {
		size_t n = min_t(size_t, len, sizeof(int3s));

		err = ki_text_write(addr, int3s, n);
		if (err)
			return err;
		addr += n;
		len -= n;
	}
	return 0;
}

static long ki_patch_alloc(struct ki_patch_alloc __user *uarg)
{
	struct ki_patch_alloc a;
	u32 need, c, run = 0, i;

	if (copy_from_user(&a, uarg, sizeof(a)))
		return -EFAULT;
	if (!a.size || a.size > KI_MAX_PATCH)
		return -EINVAL;
	need = DIV_ROUND_UP(a.size, KI_CHUNK);
	for (c = 0; c < KI_NCHUNKS; c++) {
		run = ki_owner[c] ? 0 : run + 1;
		if (run == need)
			break;
	}
	if (c == KI_NCHUNKS)
		return -ENOSPC;
	c = c + 1 - need;
	for (i = 0; i < need; i++)
		ki_owner[c + i] = c + 1;
	ki_alloc_len[c] = need;
	ki_alloc_spliced[c] = false;
	a.addr = ki_chunk_addr(c);
	if (copy_to_user(uarg, &a, sizeof(a))) {
		for (i = 0; i < need; i++)
			ki_owner[c + i] = 0;
		return -EFAULT;
	}
	return 0;
}

static long ki_patch_write(struct ki_patch_write __user *uarg)
{
	struct ki_patch_write w;
	long first;
	void *buf;
	int err;

	if (copy_from_user(&w, uarg, sizeof(w)))
		return -EFAULT;
	if (!w.len || w.len > KI_MAX_PATCH)
		return -EINVAL;
	first = ki_alloc_of(w.addr, w.len);
	if (first < 0)
		return -EINVAL;
	if (ki_alloc_busy(first))
		return -EBUSY;
	if (ki_alloc_spliced[first])
		ki_quiesce();
	buf = memdup_user(u64_to_user_ptr(w.buf), w.len);
	if (IS_ERR(buf))
		return PTR_ERR(buf);
	err = ki_text_write(w.addr, buf, w.len);
	kfree(buf);
	return err;
}

static long ki_patch_free_one(u32 first)
{
	u32 i, n = ki_alloc_len[first];
	int err;

	if (ki_alloc_busy(first))
		return -EBUSY;
	if (ki_alloc_spliced[first])
		ki_quiesce();
	err = ki_fill_int3(ki_chunk_addr(first), (size_t)n * KI_CHUNK);
	if (err)
		return err;
	for (i = 0; i < n; i++)
		ki_owner[first + i] = 0;
	ki_alloc_len[first] = 0;
	ki_alloc_spliced[first] = false;
	return 0;
}

static long ki_patch_free(struct ki_patch_free __user *uarg)
{
	struct ki_patch_free f;
	long first;

	if (copy_from_user(&f, uarg, sizeof(f)))
		return -EFAULT;
	first = ki_alloc_of(f.addr, 1);
	if (first < 0 || ki_chunk_addr(first) != f.addr)
		return -EINVAL;
	return ki_patch_free_one(first);
}

/* ---- splicing -------------------------------------------------------- */

static long ki_splice(struct ki_splice __user *uarg)
{
	struct ki_splice s;
	struct ki_splice_rec *rec = NULL;
	u8 cur[16];
	long first;
	int i, err;

	if (copy_from_user(&s, uarg, sizeof(s)))
		return -EFAULT;
	if (s.len < 1 || s.len > KI_MAX_INSN)
		return -EINVAL;
	/* The replacement: jmp rel32 to the patch, or a trap. */
	if (s.len == 5 && s.new[0] == KI_JMP32) {
		s32 rel = (s32)get_unaligned_le32(&s.new[1]);

		if (s.addr + 5 + (long)rel != s.patch)
			return -EINVAL;
	} else if (!(s.len == 1 && s.new[0] == KI_INT3)) {
		return -EINVAL;
	}
	first = ki_alloc_of(s.patch, 1);
	if (first < 0 || ki_chunk_addr(first) != s.patch)
		return -EINVAL;
	if (!ki_is_text(s.addr, s.len) || ki_in_own_module(s.addr, s.len))
		return -EPERM;
	for (i = 0; i < ki_nr_hw; i++) {
		struct ki_splice_rec *r = &ki_splices[i];

		if (!r->addr) {
			if (!rec)
				rec = r;
			continue;
		}
		if (s.addr < r->addr + r->len && s.addr + s.len > r->addr)
			return -EEXIST;
	}
	if (!rec) {
		if (ki_nr_hw == KI_MAX_SPLICES)
			return -ENOSPC;
		rec = &ki_splices[ki_nr_hw];
	}
	if (copy_from_kernel_nofault(cur, (void *)(unsigned long)s.addr, s.len))
		return -EFAULT;
	if (memcmp(cur, s.orig, s.len))
		return -ESTALE;

	rec->patch = s.patch;
	rec->len = s.len;
	rec->id = ki_next_id++;
	memcpy(rec->orig, s.orig, s.len);
	smp_wmb();
	WRITE_ONCE(rec->addr, s.addr);
	if (rec == &ki_splices[ki_nr_hw])
		WRITE_ONCE(ki_nr_hw, ki_nr_hw + 1);
	ki_alloc_spliced[first] = true;

	err = ki_poke(s.addr, s.new, s.len);
	if (err) {
		/* Put back what we can; the notifier covers a left-over int3. */
		if (!ki_poke(s.addr, rec->orig, rec->len))
			WRITE_ONCE(rec->addr, 0);
		else
			ki_nr_splices++;
		ki_need_tasks_gp = true;
		return err;
	}
	ki_nr_splices++;
	s.id = rec->id;
	if (copy_to_user(&uarg->id, &s.id, sizeof(s.id)))
		return -EFAULT;	/* installed; release() removes it */
	return 0;
}

static int ki_unsplice_rec(struct ki_splice_rec *r)
{
	int err = ki_poke(r->addr, r->orig, r->len);

	if (err)
		return err;
	/* Bytes restored and every CPU synced: no CPU can be in, or enter,
	 * the notifier for this address any more. */
	WRITE_ONCE(r->addr, 0);
	ki_nr_splices--;
	ki_need_tasks_gp = true;
	return 0;
}

static long ki_unsplice(struct ki_unsplice __user *uarg)
{
	struct ki_unsplice u;
	int i;

	if (copy_from_user(&u, uarg, sizeof(u)))
		return -EFAULT;
	for (i = 0; i < ki_nr_hw; i++)
		if (ki_splices[i].addr && ki_splices[i].id == u.id)
			return ki_unsplice_rec(&ki_splices[i]);
	return -ENOENT;
}

/* ---- the device ------------------------------------------------------ */

static long ki_read(struct ki_read __user *uarg)
{
	struct ki_read r;
	u8 *buf;
	u64 done = 0;
	long err = 0;

	if (copy_from_user(&r, uarg, sizeof(r)))
		return -EFAULT;
	if (!r.len || r.len > KI_MAX_READ)
		return -EINVAL;
	buf = kmalloc(PAGE_SIZE, GFP_KERNEL);
	if (!buf)
		return -ENOMEM;
	while (done < r.len) {
		size_t n = min_t(u64, r.len - done, PAGE_SIZE);

		if (copy_from_kernel_nofault(buf, (void *)(unsigned long)(r.addr + done), n)) {
			err = -EFAULT;
			break;
		}
		if (copy_to_user(u64_to_user_ptr(r.buf + done), buf, n)) {
			err = -EFAULT;
			break;
		}
		done += n;
	}
	kfree(buf);
	return err;
}

static long ki_info(struct ki_info __user *uarg)
{
	struct ki_info in = {
		.abi_version = KI_ABI_VERSION,
		.chunk_size = KI_CHUNK,
		.patch_heap = (unsigned long)ki_patch_heap,
		.patch_heap_size = KI_HEAP_SIZE,
		.counter_heap = (unsigned long)ki_counters,
		.counter_heap_size = KI_COUNTER_SIZE,
		.module_text = (unsigned long)THIS_MODULE->core_layout.base,
		.module_text_size = THIS_MODULE->core_layout.text_size,
		.nr_splices = ki_nr_splices,
		.int3_hits = atomic_read(&ki_int3_hits),
	};

	return copy_to_user(uarg, &in, sizeof(in)) ? -EFAULT : 0;
}

static long ki_counters_clear(struct ki_counters_clear __user *uarg)
{
	struct ki_counters_clear c;
	u32 i;

	if (copy_from_user(&c, uarg, sizeof(c)))
		return -EFAULT;
	if (c.first >= ARRAY_SIZE(ki_counters) || c.count > ARRAY_SIZE(ki_counters) - c.first)
		return -EINVAL;
	for (i = 0; i < c.count; i++)
		WRITE_ONCE(ki_counters[c.first + i], 0);
	return 0;
}

static long ki_ioctl(struct file *f, unsigned int cmd, unsigned long arg)
{
	void __user *uarg = (void __user *)arg;
	long ret;

	if (!capable(CAP_SYS_ADMIN))
		return -EPERM;
	mutex_lock(&ki_lock);
	switch (cmd) {
	case KI_IOC_INFO:
		ret = ki_info(uarg);
		break;
	case KI_IOC_READ:
		ret = ki_read(uarg);
		break;
	case KI_IOC_PATCH_ALLOC:
		ret = ki_patch_alloc(uarg);
		break;
	case KI_IOC_PATCH_WRITE:
		ret = ki_patch_write(uarg);
		break;
	case KI_IOC_PATCH_FREE:
		ret = ki_patch_free(uarg);
		break;
	case KI_IOC_SPLICE:
		ret = ki_splice(uarg);
		break;
	case KI_IOC_UNSPLICE:
		ret = ki_unsplice(uarg);
		break;
	case KI_IOC_COUNTERS_CLEAR:
		ret = ki_counters_clear(uarg);
		break;
	default:
		ret = -ENOTTY;
	}
	mutex_unlock(&ki_lock);
	return ret;
}

static int ki_mmap(struct file *f, struct vm_area_struct *vma)
{
	unsigned long size = vma->vm_end - vma->vm_start, off;
	int err;

	if (vma->vm_pgoff || size > KI_COUNTER_SIZE)
		return -EINVAL;
	if (vma->vm_flags & VM_WRITE)
		return -EPERM;
	vma->vm_flags &= ~VM_MAYWRITE;
	vma->vm_flags |= VM_DONTEXPAND | VM_DONTDUMP;
	for (off = 0; off < size; off += PAGE_SIZE) {
		struct page *pg = vmalloc_to_page((u8 *)ki_counters + off);

		if (!pg)
			return -EFAULT;
		err = remap_pfn_range(vma, vma->vm_start + off, page_to_pfn(pg), PAGE_SIZE, vma->vm_page_prot);
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

/* Restore every splice, newest first, then reclaim the whole heap. */
static void ki_restore_all(void)
{
	u32 c;
	int i;

	for (i = ki_nr_hw - 1; i >= 0; i--) {
		if (ki_splices[i].addr && ki_unsplice_rec(&ki_splices[i]))
			pr_err("kerninst: cannot restore %px\n", (void *)ki_splices[i].addr);
	}
	synchronize_rcu_tasks();
	ki_need_tasks_gp = false;
	for (c = 0; c < KI_NCHUNKS; c++)
		if (ki_owner[c] == c + 1 && ki_patch_free_one(c))
			pr_err("kerninst: cannot reclaim patch %px\n", (void *)ki_chunk_addr(c));
}

static int ki_release(struct inode *inode, struct file *f)
{
	mutex_lock(&ki_lock);
	if (ki_nr_splices)
		pr_info("kerninst: device closed with %u splice(s); restoring\n", ki_nr_splices);
	ki_restore_all();
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
};

static struct miscdevice ki_dev = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "kerninst",
	.fops = &ki_fops,
	.mode = 0600,
};

static int __init ki_init(void)
{
	int err = register_die_notifier(&ki_die_nb);

	if (err)
		return err;
	err = misc_register(&ki_dev);
	if (err) {
		unregister_die_notifier(&ki_die_nb);
		return err;
	}
	pr_info("kerninst: patch heap %px (%d KiB), counter heap %px (%d KiB)\n",
		ki_patch_heap, KI_HEAP_SIZE >> 10, ki_counters, KI_COUNTER_SIZE >> 10);
	return 0;
}

static void __exit ki_exit(void)
{
	misc_deregister(&ki_dev);
	/* Unreachable with splices installed: the open device pins the
	 * module. Defensive all the same. */
	mutex_lock(&ki_lock);
	ki_restore_all();
	mutex_unlock(&ki_lock);
	unregister_die_notifier(&ki_die_nb);
}

module_init(ki_init);
module_exit(ki_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("kinst: splice instrumentation into the running kernel");
