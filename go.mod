module github.com/kinst/kinst

go 1.26.0

require (
	github.com/cavaliergopher/cpio v1.0.1
	github.com/spf13/pflag v1.1.0
	golang.org/x/arch v0.32.0
	golang.org/x/sys v0.49.0
)

require (
	github.com/anchore/go-lzo v0.1.1
	github.com/cilium/ebpf v0.22.0
	github.com/google/pprof v0.0.0-20261016150608-1facf8f91b50
	github.com/klauspost/compress v1.18.0
)
