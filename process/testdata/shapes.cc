// A C++ workload for the process engine's tests: "go N" calls
// shapes::Circle::area() and shapes::Square::area() N times each through
// a virtual call and prints the calls it made.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

namespace shapes {
struct Shape {
	virtual ~Shape() = default;
	virtual double area() const = 0;
};
struct Circle : Shape {
	double r;
	explicit Circle(double r) : r(r) {}
	__attribute__((noinline)) double area() const override { return 3.14159 * r * r; }
};
struct Square : Shape {
	double s;
	explicit Square(double s) : s(s) {}
	__attribute__((noinline)) double area() const override { return s * s; }
};
__attribute__((noinline)) double total(const std::vector<std::unique_ptr<Shape>> &v)
{
	double t = 0;
	for (auto &s : v)
		t += s->area();
	return t;
}
} // namespace shapes

int main()
{
	char line[64];
	setvbuf(stdout, nullptr, _IOLBF, 0);
	std::vector<std::unique_ptr<shapes::Shape>> v;
	v.emplace_back(new shapes::Circle(1.5));
	v.emplace_back(new shapes::Square(2.0));
	printf("ready\n");
	while (fgets(line, sizeof line, stdin)) {
		if (strncmp(line, "go ", 3) != 0)
			break;
		long n = strtol(line + 3, nullptr, 10);
		double t = 0;
		for (long i = 0; i < n; i++)
			t += shapes::total(v);
		printf("calls %ld total %.1f\n", n, t);
	}
	return 0;
}
