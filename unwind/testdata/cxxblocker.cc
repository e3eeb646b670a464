// A C++ program that blocks in read(2) below main → level1 →
// shapes::Box<double>::level2 → level3, for the demangling tests.
#include <cstdio>
#include <map>
#include <string>
#include <unistd.h>

namespace shapes {
template <typename T> struct Box {
	T v;
	__attribute__((noinline, noclone)) int level2(const std::string &s) const;
};
} // namespace shapes

volatile int sink;

__attribute__((noinline, noclone)) int level3()
{
	char b[8];
	int n = read(0, b, sizeof b);
	sink += n;
	return n + 3;
}

template <typename T> int shapes::Box<T>::level2(const std::string &s) const
{
	int r = level3();
	sink += r;
	return r + int(s.size()) + int(v);
}

__attribute__((noinline, noclone)) int level1(std::map<std::string, int> &m)
{
	shapes::Box<double> b{1};
	int r = b.level2("x");
	sink += r;
	return r + int(m.size());
}

int main()
{
	std::map<std::string, int> m;
	printf("ready\n");
	fflush(stdout);
	return level1(m) & 0;
}
