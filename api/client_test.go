package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestAddrJSON(t *testing.T) {
	b, err := json.Marshal(Memory{Address: 0xffffffff81000000, Bytes: "c3"})
	if err != nil || string(b) != `{"address":"0xffffffff81000000","bytes":"c3"}` {
		t.Fatalf("%s, %v", b, err)
	}
	var m Memory
	if err := json.Unmarshal(b, &m); err != nil || m.Address != 0xffffffff81000000 {
		t.Fatalf("%+v, %v", m, err)
	}
	if err := json.Unmarshal([]byte(`{"address":"12"}`), &m); err == nil {
		t.Error("an address without 0x decoded")
	}
}

// The client speaks the API as the daemon serves it: error replies
// become *APIError, streams are read line by line.
func TestClient(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sessions", func(w http.ResponseWriter, r *http.Request) {
		var req SessionRequest
		json.NewDecoder(r.Body).Decode(&req)
		w.WriteHeader(http.StatusUnprocessableEntity)
		json.NewEncoder(w).Encode(ErrorResponse{Error: req.Points[0] + ": no splice", Code: CodeNoSplice, Point: req.Points[0]})
	})
	mux.HandleFunc("GET /v1/sessions/{id}/samples", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("interval") != "250ms" {
			http.Error(w, "bad interval", http.StatusBadRequest)
			return
		}
		for i := 1; i <= 2; i++ {
			fmt.Fprintf(w, `{"time":"2024-10-01T12:00:0%dZ","totals":[%d],"deltas":[1]}`+"\n", i, i)
		}
	})
	mux.HandleFunc("GET /v1/cfg/stats", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, `{"done":1,"total":2}`)
		fmt.Fprintln(w, `{"done":2,"total":2}`)
		fmt.Fprintln(w, `{"stats":{"functions":2,"splice_classes":{"direct":3}}}`)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	c := NewClient(strings.TrimPrefix(srv.URL, "http://"))
	ctx := context.Background()

	_, err := c.CreateSession(ctx, SessionRequest{Points: []string{"exc_int3"}})
	var ae *APIError
	if !errors.As(err, &ae) || ae.Status != http.StatusUnprocessableEntity || ae.Code != CodeNoSplice || ae.Point != "exc_int3" {
		t.Errorf("error reply: %#v", err)
	}

	st, err := c.Samples(ctx, "s1", 250*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= 2; i++ {
		s, err := st.Next()
		if err != nil || s.Totals[0] != i || s.Time.Second() != int(i) {
			t.Fatalf("sample %d: %+v, %v", i, s, err)
		}
	}
	if _, err := st.Next(); err != io.EOF {
		t.Errorf("after the stream: %v, want io.EOF", err)
	}
	st.Close()

	var progress []int
	stats, err := c.CFGStats(ctx, func(done, total int) { progress = append(progress, done) })
	if err != nil || stats.Functions != 2 || stats.SpliceClasses["direct"] != 3 || len(progress) != 2 {
		t.Errorf("stats %+v, progress %v, %v", stats, progress, err)
	}

	if _, err := NewClient("127.0.0.1:1").Info(ctx); err == nil || !strings.Contains(err.Error(), "is kerninstd running?") {
		t.Errorf("no daemon: %v", err)
	}
	if got := NewClient("").Addr(); got != DefaultSocket {
		t.Errorf("default address %q", got)
	}
}

// A daemon that takes a request and dies before answering (the OOM
// killer) is told apart from one that is not running, and the error says
// where to look.
func TestClientDaemonDied(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			buf := make([]byte, 4096)
			conn.Read(buf) // the request, then no answer
			conn.Close()
		}
	}()
	_, err = NewClient(ln.Addr().String()).CreateSession(context.Background(), SessionRequest{Points: []string{"vfs_read"}})
	if !errors.Is(err, ErrDaemonDied) || !strings.Contains(err.Error(), "dmesg") || !strings.Contains(err.Error(), "POST /v1/sessions") {
		t.Errorf("daemon died mid-request: %v", err)
	}
	if _, err := NewClient("127.0.0.1:1").Info(context.Background()); errors.Is(err, ErrDaemonDied) {
		t.Errorf("no daemon at all called a death: %v", err)
	}
}
