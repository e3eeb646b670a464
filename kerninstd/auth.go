package kerninstd

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
)

// ErrOpenListener: a TCP listener that anyone on the network could reach,
// with no token to tell kinst's clients from anyone else. Whoever reaches
// kerninstd can splice code into the kernel.
var ErrOpenListener = errors.New("kerninstd: refusing a non-loopback TCP listener without a token")

// CheckListen refuses addr unless it binds loopback only or a token is
// configured. An empty host (":7070") and 0.0.0.0 bind every address.
func CheckListen(addr string, token bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("kerninstd: --listen %q: %w", addr, err)
	}
	if token {
		return nil
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("%w: %s (listen on 127.0.0.1, or give --token-file FILE and have clients send it with KINST_TOKEN_FILE)", ErrOpenListener, addr)
}

// RequireToken serves only requests that carry "Authorization: Bearer
// TOKEN"; others get 401 and reach nothing.
func RequireToken(h http.Handler, token string) http.Handler {
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := []byte(r.Header.Get("Authorization"))
		if subtle.ConstantTimeCompare(got, want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="kerninstd"`)
			http.Error(w, `{"error":"kerninstd: missing or wrong token (set KINST_TOKEN_FILE or --token-file)"}`, http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}
