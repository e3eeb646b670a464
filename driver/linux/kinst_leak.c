// SPDX-License-Identifier: GPL-2.0
// Go tooling: this file is kernel C, embedded by embed.go, never built by cgo.
//go:build ignore

/*
 * kinst_leak: a test module for `kinst core findleaks`, never loaded but
 * by the live tests. From a kernel thread it allocates objects from its
 * own cache and keeps five reachable from a global array, five from a
 * global list and five from the thread's own stack, and drops the
 * pointers to ten: the leaks. Each object's address and how it is held
 * go to the kernel log ("kinst_leak: leaked ADDR", "array", "list",
 * "stack"). It also vmallocs two areas, keeping one in a global
 * ("vheld") and dropping the other ("vleaked"): a leak findleaks must
 * find beside the slabs. The thread's dead stack is zeroed after the leaks, so no
 * stale copy of a leaked pointer stays where a conservative scan would
 * find it. The cache is never destroyed (it holds the leaks): the module
 * is not meant to be unloaded.
 */
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/kthread.h>
#include <linux/delay.h>
#include <linux/string.h>
#include <linux/vmalloc.h>

#define NLEAK 10
#define NHELD 5

struct kinst_leak_obj {
	struct list_head node;
	unsigned long tag;
	char pad[80];
};

static struct kmem_cache *leak_cache;
/* __used: nothing in the module reads it before exit, and the stores
 * into a static array that is never read would be dropped. */
static struct kinst_leak_obj *held_array[NHELD] __used;
static LIST_HEAD(held_list);
static void *vheld __used;
static struct task_struct *holder;

/* A constructor keeps the cache from being merged with another. */
static void leak_ctor(void *p)
{
	memset(p, 0, sizeof(struct kinst_leak_obj));
}

static noinline void leak_some(void)
{
	int i;

	for (i = 0; i < NLEAK; i++) {
		struct kinst_leak_obj *o = kmem_cache_alloc(leak_cache, GFP_KERNEL);

		if (o) {
			o->tag = 0x4c45414b; /* "LEAK" */
			pr_info("kinst_leak: leaked %px\n", o);
		}
	}
}

static noinline void hold_some(void)
{
	int i;

	for (i = 0; i < NHELD; i++) {
		held_array[i] = kmem_cache_alloc(leak_cache, GFP_KERNEL);
		if (held_array[i])
			pr_info("kinst_leak: array %px\n", held_array[i]);
	}
	for (i = 0; i < NHELD; i++) {
		struct kinst_leak_obj *o = kmem_cache_alloc(leak_cache, GFP_KERNEL);

		if (o) {
			list_add(&o->node, &held_list);
			pr_info("kinst_leak: list %px\n", o);
		}
	}
}

static noinline void vleak_some(void)
{
	void *v = vmalloc(3 * PAGE_SIZE);

	if (v) {
		memset(v, 0x5a, 3 * PAGE_SIZE);
		pr_info("kinst_leak: vleaked %px\n", v);
	}
	vheld = vmalloc(2 * PAGE_SIZE);
	if (vheld)
		pr_info("kinst_leak: vheld %px\n", vheld);
}

/* Overwrites the stack below the caller's frame, where the callees of
 * leak_some (printk's, the allocator's) left copies of its pointers. */
static noinline void scrub_stack(void)
{
	char buf[6144];

	memzero_explicit(buf, sizeof(buf));
}

static int leak_thread(void *arg)
{
	struct kinst_leak_obj *volatile on_stack[NHELD];
	int i;

	leak_some();
	vleak_some();
	scrub_stack();
	hold_some();
	for (i = 0; i < NHELD; i++) {
		on_stack[i] = kmem_cache_alloc(leak_cache, GFP_KERNEL);
		if (on_stack[i])
			pr_info("kinst_leak: stack %px\n", on_stack[i]);
	}
	pr_info("kinst_leak: ready\n");
	while (!kthread_should_stop())
		msleep_interruptible(200);
	for (i = 0; i < NHELD; i++)
		if (on_stack[i])
			kmem_cache_free(leak_cache, on_stack[i]);
	return 0;
}

static int __init kinst_leak_init(void)
{
	leak_cache = kmem_cache_create("kinst_leak", sizeof(struct kinst_leak_obj), 0, 0, leak_ctor);
	if (!leak_cache)
		return -ENOMEM;
	holder = kthread_run(leak_thread, NULL, "kinst_leak");
	if (IS_ERR(holder))
		return PTR_ERR(holder);
	return 0;
}

static void __exit kinst_leak_exit(void)
{
	struct kinst_leak_obj *o, *next;
	int i;

	kthread_stop(holder);
	for (i = 0; i < NHELD; i++)
		if (held_array[i])
			kmem_cache_free(leak_cache, held_array[i]);
	list_for_each_entry_safe(o, next, &held_list, node)
		kmem_cache_free(leak_cache, o);
}

module_init(kinst_leak_init);
module_exit(kinst_leak_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("kinst findleaks test: a known set of leaked objects");
