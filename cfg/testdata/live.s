# Fixture for TestLiveness.
	.text
f:
	.byte 0x0f, 0x1f, 0x44, 0x00, 0x00	# ftrace site: nopl 0x0(%rax,%rax,1)
	push %rbx			# +5
	mov %rdi, %rbx			# +6   rdi read, rbx written
	xor %eax, %eax			# +9   zero idiom: rax not read
	cmp $3, %esi			# +b   flags written
	mov $1, %ecx			# +e   (flags live across: cmp … jcc)
	jne 1f				# +13
	call g				# +15  clobbers caller-saved
	add %rbx, %rax			# +1a
1:
	pop %rbx
	jmp __x86_return_thunk
g:
	ret
__x86_return_thunk:
	ret
