package offcpu

import (
	"bytes"
	"errors"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"
)

// openRO opens a /proc file for repeated pread at offset 0: seq files
// regenerate their content when read from the start, so one descriptor
// serves every pass.
func openRO(path string) (int, error) {
	return unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
}

// preadAll reads a whole /proc file from offset 0 into buf, growing it
// when the file does not fit.
func preadAll(fd int, buf []byte) ([]byte, error) {
	for {
		n, err := unix.Pread(fd, buf, 0)
		if err != nil {
			return buf[:0], err
		}
		if n < len(buf) {
			return buf[:n], nil
		}
		buf = make([]byte, 2*len(buf))
	}
}

// readDirIDs appends the numeric names in directory path (the pids under
// /proc, the tids under /proc/PID/task) to out, without allocating per
// entry: linux_dirent64 records are parsed in place.
func readDirIDs(path string, buf []byte, out []int) ([]int, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return out, err
	}
	defer unix.Close(fd)
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			return out, err
		}
		if n <= 0 {
			return out, nil
		}
		for off := 0; off+19 < n; {
			// struct linux_dirent64 { u64 ino; s64 off; u16 reclen; u8 type; char name[]; }
			reclen := int(*(*uint16)(unsafe.Pointer(&buf[off+16])))
			if reclen == 0 {
				break
			}
			name := buf[off+19 : off+reclen]
			if i := bytes.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			if id, ok := atoi(name); ok {
				out = append(out, id)
			}
			off += reclen
		}
	}
}

func atoi(b []byte) (int, bool) {
	if len(b) == 0 {
		return 0, false
	}
	v := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int(c-'0')
	}
	return v, true
}

// statFields is what the sampler needs from /proc/PID/task/TID/stat.
type statFields struct {
	comm  []byte // aliases the read buffer
	state byte
	flags uint64
}

// pfKthread is PF_KTHREAD in the flags field of stat (include/linux/sched.h).
const pfKthread = 0x00200000

var errStatFormat = errors.New("unexpected /proc stat format")

// parseStat parses "tid (comm) S ppid pgrp session tty tpgid flags …";
// comm may itself contain spaces and parentheses, so it ends at the last ')'.
func parseStat(b []byte) (statFields, error) {
	open := bytes.IndexByte(b, '(')
	close := bytes.LastIndexByte(b, ')')
	if open < 0 || close < open || close+3 >= len(b) {
		return statFields{}, errStatFormat
	}
	s := statFields{comm: b[open+1 : close], state: b[close+2]}
	rest := b[close+4:]
	// Fields after state: ppid pgrp session tty_nr tpgid flags.
	for i := 0; i < 5; i++ {
		sp := bytes.IndexByte(rest, ' ')
		if sp < 0 {
			return statFields{}, errStatFormat
		}
		rest = rest[sp+1:]
	}
	end := bytes.IndexByte(rest, ' ')
	if end < 0 {
		return statFields{}, errStatFormat
	}
	f, err := strconv.ParseUint(string(rest[:end]), 10, 64)
	if err != nil {
		return statFields{}, errStatFormat
	}
	s.flags = f
	return s, nil
}

// kernelFrames turns /proc/PID/stack text ("[<0>] func+0x1/0x2 [mod]"
// lines, innermost first) into function names.
func kernelFrames(b []byte) []string {
	var out []string
	for len(b) > 0 {
		line := b
		if nl := bytes.IndexByte(b, '\n'); nl >= 0 {
			line, b = b[:nl], b[nl+1:]
		} else {
			b = nil
		}
		if i := bytes.IndexByte(line, ']'); i >= 0 {
			line = bytes.TrimLeft(line[i+1:], " ")
		}
		if i := bytes.IndexByte(line, '+'); i >= 0 {
			line = line[:i]
		}
		if len(line) > 0 {
			out = append(out, string(line))
		}
	}
	return out
}

var errSchedstatFormat = errors.New("unexpected /proc schedstat format")

// parseSchedstat returns the third field of "run_ns wait_ns timeslices":
// how many times the thread has been scheduled in.
func parseSchedstat(b []byte) (uint64, error) {
	b = bytes.TrimRight(b, "\n")
	i := bytes.LastIndexByte(b, ' ')
	if i < 0 {
		return 0, errSchedstatFormat
	}
	v, ok := atoi(b[i+1:])
	if !ok {
		return 0, errSchedstatFormat
	}
	return uint64(v), nil
}
