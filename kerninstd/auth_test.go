package kerninstd

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestCheckListen(t *testing.T) {
	for _, c := range []struct {
		addr  string
		token bool
		ok    bool
	}{
		{"127.0.0.1:7070", false, true},
		{"[::1]:7070", false, true},
		{"localhost:7070", false, true},
		{"0.0.0.0:7070", false, false},
		{":7070", false, false},
		{"10.0.2.15:7070", false, false},
		{"[::]:7070", false, false},
		{"0.0.0.0:7070", true, true},
		{":7070", true, true},
	} {
		err := CheckListen(c.addr, c.token)
		if (err == nil) != c.ok {
			t.Errorf("CheckListen(%q, token=%v) = %v; want ok=%v", c.addr, c.token, err, c.ok)
		}
		if err != nil && !errors.Is(err, ErrOpenListener) {
			t.Errorf("CheckListen(%q): %v is not ErrOpenListener", c.addr, err)
		}
	}
	if err := CheckListen("7070", false); err == nil || errors.Is(err, ErrOpenListener) {
		t.Errorf("CheckListen without a port separator: %v; want a parse error", err)
	}
}

func TestRequireToken(t *testing.T) {
	h := RequireToken(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) }), "0123456789abcdef")
	for _, c := range []struct {
		auth string
		code int
	}{
		{"", http.StatusUnauthorized},
		{"Bearer wrong", http.StatusUnauthorized},
		{"Bearer 0123456789abcdef0", http.StatusUnauthorized},
		{"bearer 0123456789abcdef", http.StatusUnauthorized},
		{"Bearer 0123456789abcdef", http.StatusOK},
	} {
		r := httptest.NewRequest("GET", "/v1/info", nil)
		if c.auth != "" {
			r.Header.Set("Authorization", c.auth)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != c.code {
			t.Errorf("Authorization %q: %d; want %d", c.auth, w.Code, c.code)
		}
	}
}
