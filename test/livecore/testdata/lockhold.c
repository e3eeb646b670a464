/*
 * lockhold FILE: write(2) to FILE from a buffer that userfaultfd never
 * fills, so the write blocks in the page fault while holding the inode's
 * i_rwsem (generic_file_write_iter's inode_lock). A second lockhold on
 * the same file waits for that rwsem. Built static, without libc, for
 * the test guest (busybox only): x86-64 Linux system calls.
 */
typedef unsigned long u64;

static long sys(long n, long a, long b, long c, long d, long e, long f)
{
	long r;
	register long r10 __asm__("r10") = d;
	register long r8 __asm__("r8") = e;
	register long r9 __asm__("r9") = f;
	__asm__ volatile("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9) : "rcx", "r11", "memory");
	return r;
}

struct uffdio_api { u64 api, features, ioctls; };
struct uffdio_register { u64 start, len, mode, ioctls; };

static void die(long code) { sys(60, code, 0, 0, 0, 0, 0); }

void _start_c(long *sp)
{
	char **argv = (char **)(sp + 1);
	if (*sp < 2)
		die(2);
	long fd = sys(2, (long)argv[1], 01 | 0100, 0644, 0, 0, 0); /* open O_WRONLY|O_CREAT */
	if (fd < 0)
		die(3);
	long uffd = sys(323, 02000000, 0, 0, 0, 0, 0); /* userfaultfd(O_CLOEXEC) */
	if (uffd < 0)
		die(4);
	struct uffdio_api api = { 0xAA, 0, 0 };
	if (sys(16, uffd, 0xc018aa3f, (long)&api, 0, 0, 0) < 0) /* UFFDIO_API */
		die(5);
	long buf = sys(9, 0, 4096, 3, 0x22, -1, 0); /* mmap anonymous */
	if (buf < 0)
		die(6);
	struct uffdio_register reg = { (u64)buf, 4096, 1, 0 }; /* MISSING */
	if (sys(16, uffd, 0xc020aa00, (long)&reg, 0, 0, 0) < 0) /* UFFDIO_REGISTER */
		die(7);
	sys(1, fd, buf, 4096, 0, 0, 0); /* blocks in the fault, i_rwsem held */
	die(0);
}

__asm__(".globl _start\n_start:\n\tmov %rsp, %rdi\n\tand $-16, %rsp\n\tcall _start_c\n");
