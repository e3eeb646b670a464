package kerninstd

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/kinst/kinst/kernel"
	"github.com/kinst/kinst/report"
)

// maxFunctions bounds one /v1/functions answer.
const maxFunctions = 1000

// serveFunctions is GET /v1/functions?q=TEXT&limit=N (default 50).
func serveFunctions(syms func() *kernel.Symbols) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		limit := 50
		if v := r.URL.Query().Get("limit"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > maxFunctions {
				writeError(w, badRequest(fmt.Errorf("limit %q: want 1..%d", v, maxFunctions)))
				return
			}
			limit = n
		}
		writeJSON(w, http.StatusOK, report.FindFunctions(syms(), r.URL.Query().Get("q"), limit, report.FindOptions{Classic: true}))
	}
}
