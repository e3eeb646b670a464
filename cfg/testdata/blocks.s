# Fixture for TestBlocks: the shapes kernel functions take on this config.
	.text
f:
	nopl 0x0(%rax,%rax,1)		# ftrace site
	push %rbp
	cmp $1, %edi
	je 1f
	call g				# calls do not end blocks
	test %eax, %eax
	jne 2f
1:
	pop %rbp
	jmp __x86_return_thunk		# return
2:
	call __x86_indirect_thunk_rax	# retpoline call
	cmp $7, %eax
	ja 3f
	jmp __x86_indirect_thunk_rax	# retpolined jmp *%rax
3:
	ud2				# WARN(): resumes
	pop %rbp
	jmp g				# tail call
	int3				# padding
	int3
	nopw 0x0(%rax,%rax,1)
g:
	ret
__x86_return_thunk:
	ret
__x86_indirect_thunk_rax:
	jmp *%rax
