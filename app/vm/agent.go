package vm

// The exec agent runs in the guest (`kinst vm agent`) and carries `kinst vm
// exec`. One TCP connection per command:
//
//	client → agent: one JSON line, agentRequest
//	agent → client: frames: 1 type byte, 4-byte big-endian length, payload
//	   'o' stdout bytes, 'e' stderr bytes, 'p' pong,
//	   'x' exit status (4-byte big-endian int32; death by signal N is 128+N),
//	   'E' an error message (the command could not be started).
//
// There is no stdin. If the connection closes before the command exits,
// the agent sends SIGINT to the command's process group, then SIGKILL 5 s
// later, as a terminal's Ctrl-C would.

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

type agentRequest struct {
	Argv []string `json:"argv,omitempty"`
	Env  []string `json:"env,omitempty"`
	Ping bool     `json:"ping,omitempty"`
}

const (
	frameStdout = 'o'
	frameStderr = 'e'
	frameExit   = 'x'
	frameError  = 'E'
	framePong   = 'p'
	maxFrame    = 1 << 20
)

type frameWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (f *frameWriter) frame(t byte, p []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var h [5]byte
	h[0] = t
	binary.BigEndian.PutUint32(h[1:], uint32(len(p)))
	if _, err := f.w.Write(h[:]); err != nil {
		return err
	}
	_, err := f.w.Write(p)
	return err
}

type streamWriter struct {
	fw *frameWriter
	t  byte
}

func (s streamWriter) Write(p []byte) (int, error) {
	for off := 0; off < len(p); off += maxFrame {
		if err := s.fw.frame(s.t, p[off:min(off+maxFrame, len(p))]); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

func readFrame(r io.Reader) (byte, []byte, error) {
	var h [5]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(h[1:])
	if n > maxFrame {
		return 0, nil, fmt.Errorf("agent frame of %d bytes", n)
	}
	p := make([]byte, n)
	_, err := io.ReadFull(r, p)
	return h[0], p, err
}

// ServeAgent serves exec requests on ln until ctx ends.
func ServeAgent(ctx context.Context, ln net.Listener) error {
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		go serveConn(conn)
	}
}

func serveConn(conn net.Conn) {
	defer conn.Close()
	br := bufio.NewReader(conn)
	line, err := br.ReadBytes('\n')
	if err != nil {
		return
	}
	fw := &frameWriter{w: conn}
	var req agentRequest
	if err := json.Unmarshal(line, &req); err != nil {
		fw.frame(frameError, []byte("bad request: "+err.Error()))
		return
	}
	if req.Ping {
		fw.frame(framePong, nil)
		return
	}
	if len(req.Argv) == 0 {
		fw.frame(frameError, []byte("empty argv"))
		return
	}
	cmd := exec.Command(req.Argv[0], req.Argv[1:]...)
	cmd.Env = append(os.Environ(), req.Env...)
	cmd.Stdout = streamWriter{fw, frameStdout}
	cmd.Stderr = streamWriter{fw, frameStderr}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		fw.frame(frameError, []byte(err.Error()))
		return
	}
	done := make(chan struct{})
	go func() {
		// The client sends nothing more: a read returning means it left.
		buf := make([]byte, 1)
		br.Read(buf)
		select {
		case <-done:
			return
		default:
		}
		syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
	}()
	err = cmd.Wait()
	close(done)
	status := 0
	if err != nil {
		status = 1
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				status = 128 + int(ws.Signal())
			} else {
				status = ee.ExitCode()
			}
		}
	}
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], uint32(int32(status)))
	fw.frame(frameExit, b[:])
}

// Exec runs argv in the guest, streaming its output, and returns its exit
// status. Cancelling ctx interrupts the command (SIGINT, then SIGKILL).
func (in *Instance) Exec(ctx context.Context, argv []string, stdout, stderr io.Writer) (int, error) {
	return agentExec(ctx, in.AgentAddr(), agentRequest{Argv: argv}, stdout, stderr)
}

func (in *Instance) ping(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	_, err := agentExec(pctx, in.AgentAddr(), agentRequest{Ping: true}, io.Discard, io.Discard)
	return err
}

var errPong = errors.New("pong")

func agentExec(ctx context.Context, addr string, req agentRequest, stdout, stderr io.Writer) (int, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return -1, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	b, _ := json.Marshal(req)
	if _, err := conn.Write(append(b, '\n')); err != nil {
		return -1, err
	}
	r := bufio.NewReader(conn)
	for {
		t, p, err := readFrame(r)
		if err != nil {
			if ctx.Err() != nil {
				return -1, ctx.Err()
			}
			return -1, fmt.Errorf("agent at %s: %w", addr, err)
		}
		switch t {
		case frameStdout:
			stdout.Write(p)
		case frameStderr:
			stderr.Write(p)
		case framePong:
			return 0, nil
		case frameError:
			return -1, fmt.Errorf("guest: %s", p)
		case frameExit:
			if len(p) != 4 {
				return -1, errors.New("agent: short exit frame")
			}
			return int(int32(binary.BigEndian.Uint32(p))), nil
		default:
			return -1, fmt.Errorf("agent: unknown frame %q", t)
		}
	}
}
