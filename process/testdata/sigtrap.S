# kinst's SIGTRAP handler in a process (process/trap.go holds its bytes;
# TestTrapHandlerBytes assembles this file and compares). Trap splices
# are int3s; the kernel turns one into SIGTRAP, and this handler, run
# with (sig, info, ucontext), moves the interrupted pc from past the int3
# to the splice's patch through a table of {int3 address, target, last
# patch, unused} entries after the code: 16384 of them, open addressing
# with linear probing. rt_sigreturn restores every register, so the handler
# may clobber any. An int3 that is not kinst's gets the default action,
# as without kinst: SIGTRAP's disposition goes back to SIG_DFL and the
# thread sends itself SIGTRAP again.
	.text
	.globl handler
handler:
	mov	168(%rdx), %rax		# uc_mcontext.gregs[REG_RIP]
	dec	%rax			# the int3's address
	mov	%rax, %rcx		# its home entry: (addr ^ addr>>12) mod 16384
	shr	$12, %rcx
	xor	%rax, %rcx
	and	$0x3fff, %ecx
	shl	$5, %rcx
	lea	table(%rip), %r9
1:	mov	(%r9,%rcx), %r8		# probe on until its address or a zero one
	test	%r8, %r8
	jz	2f
	cmp	%rax, %r8
	je	3f
	add	$32, %rcx
	and	$0x7ffff, %ecx
	jmp	1b
3:	mov	8(%r9,%rcx), %r8	# the target
	cmp	%rax, %r8		# the splice is gone (the target is the int3's own address)...
	jne	4f
	cmpb	$0xcc, (%rax)		# ...but its int3 is still here: a forked child's copy of the text
	jne	4f
	mov	16(%r9,%rcx), %r8	# so the last patch, whose code is kept
4:	mov	%r8, 168(%rdx)
	ret
2:	sub	$40, %rsp		# a struct kernel_sigaction of SIG_DFL
	xor	%eax, %eax
	mov	%rax, (%rsp)
	mov	%rax, 8(%rsp)
	mov	%rax, 16(%rsp)
	mov	%rax, 24(%rsp)
	mov	$13, %eax		# rt_sigaction(SIGTRAP, &dfl, NULL, 8)
	mov	$5, %edi
	mov	%rsp, %rsi
	xor	%edx, %edx
	mov	$8, %r10d
	syscall
	add	$40, %rsp
	mov	$39, %eax		# getpid
	syscall
	mov	%eax, %ebx
	mov	$186, %eax		# gettid
	syscall
	mov	%eax, %esi
	mov	%ebx, %edi
	mov	$5, %edx
	mov	$234, %eax		# tgkill(pid, tid, SIGTRAP)
	syscall
	ret
	.globl restorer
restorer:
	mov	$15, %eax		# rt_sigreturn
	syscall
	.balign 128, 0xcc
table:
