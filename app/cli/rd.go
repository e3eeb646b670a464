package cli

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"strings"

	"github.com/kinst/kinst/api"
)

// Read prints live kernel memory as crash's rd does: address, 16 bytes
// in hex, and their printable characters.
func Read(ctx context.Context, c *api.Client, at string, n int, asJSON bool, env Env) error {
	w := env.Out
	m, err := c.Read(ctx, at, n)
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(w, m)
	}
	b, err := hex.DecodeString(m.Bytes)
	if err != nil {
		return err
	}
	if m.Symbol != "" {
		fmt.Fprintf(w, "%#x <%s>:\n", uint64(m.Address), m.Symbol)
	}
	HexDump(w, uint64(m.Address), b)
	return nil
}

// HexDump writes b as lines of 16 bytes starting at addr.
func HexDump(w io.Writer, addr uint64, b []byte) {
	for off := 0; off < len(b); off += 16 {
		line := b[off:min(off+16, len(b))]
		var hx, asc strings.Builder
		for i := 0; i < 16; i++ {
			if i < len(line) {
				fmt.Fprintf(&hx, "%02x ", line[i])
				c := line[i]
				if c < 0x20 || c > 0x7e {
					c = '.'
				}
				asc.WriteByte(c)
			} else {
				hx.WriteString("   ")
			}
			if i == 7 {
				hx.WriteByte(' ')
			}
		}
		fmt.Fprintf(w, "%016x:  %s %s\n", addr+uint64(off), hx.String(), asc.String())
	}
}
