/* A function gcc splits into a hot part and checked.cold, so that its
   DWARF gives DW_AT_ranges instead of a low_pc. */
extern void report_failure(const char *what, int v) __attribute__((cold));

int checked(int v)
{
	if (__builtin_expect(v < 0, 0)) {
		report_failure("negative", v);
		report_failure("again", v);
		return -1;
	}
	return v * 2;
}
