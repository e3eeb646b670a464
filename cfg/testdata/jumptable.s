# Fixture for TestJumpTables: the two shapes of switch jump tables, the
# second through a retpoline thunk as a retpoline kernel would emit it.
	.text
	.globl f
f:
	cmp $3, %edi
	ja 9f
	mov %edi, %edi
	jmp *abs_table(,%rdi,8)		# absolute table, 4 entries
1:	mov $10, %eax
	ret
2:	mov $11, %eax
	ret
3:	mov $12, %eax
	ret
4:	mov $13, %eax
	ret
9:	cmp $2, %esi
	jae 8f
	lea rel_table(%rip), %rdx
	movslq (%rdx,%rsi,4), %rax
	add %rdx, %rax
	jmp __x86_indirect_thunk_rax	# relative table, 2 entries
5:	xor %eax, %eax
	ret
6:	mov $1, %eax
	ret
8:	jmp *%rcx			# no table: stays unresolved
g:
	ret
__x86_indirect_thunk_rax:
	jmp *%rax

	.section .rodata
	.balign 8
abs_table:
	.quad 1b, 2b, 3b, 4b
rel_table:
	.long 5b - rel_table, 6b - rel_table
