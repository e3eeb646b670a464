package cli

import (
	"bytes"
	"strings"
	"testing"

	"github.com/kinst/kinst/core"
)

// TestCoreStackJSON: a stack without frames has "frames":[], never null,
// and its text says why once.
func TestCoreStackJSON(t *testing.T) {
	for _, tc := range []struct {
		name string
		st   core.Stack
		json string // a substring of the JSON
		text string // a line of the text, exactly once
	}{
		{"nil frames", core.Stack{Task: core.Task{PID: 9}, Stop: "switch frame at 0x10: not mapped"}, `"frames":[]`, "(switch frame at 0x10: not mapped)"},
		{"user mode", core.Stack{Task: core.Task{PID: 9, Active: true}, UserMode: true}, `"frames":[],"user_mode":true`, "(running in user mode: no kernel frames)"},
		{"frames", core.Stack{Task: core.Task{PID: 9}, Frames: []core.Frame{{AddrHex: "0x1", Function: "f"}}}, `"frames":[{"address":"0x1","function":"f","offset":0}]`, "#0  0x1 f"},
	} {
		var b bytes.Buffer
		if err := writeJSON(&b, coreStack(&tc.st)); err != nil {
			t.Fatal(err)
		}
		if compact := strings.Join(strings.Fields(b.String()), ""); !strings.Contains(compact, tc.json) {
			t.Errorf("%s: JSON %s, want %s in it", tc.name, compact, tc.json)
		}
		b.Reset()
		printStack(&b, &tc.st)
		if n := strings.Count(b.String(), tc.text); n != 1 {
			t.Errorf("%s: text has %q %d times:\n%s", tc.name, tc.text, n, b.String())
		}
	}
}
