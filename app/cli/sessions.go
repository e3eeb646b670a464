package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/kinst/kinst/api"
)

// Ls lists the live sessions (`kinst ls`). --json: the []Session of
// GET /v1/sessions.
func Ls(ctx context.Context, c *api.Client, asJSON bool, env Env) error {
	stdout := env.Out
	list, err := c.Sessions(ctx)
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(stdout, list)
	}
	if len(list) == 0 {
		fmt.Fprintln(stdout, "no sessions")
		return nil
	}
	tw := newTable(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tID\tAGE\tEXPIRES IN\tTIED\tINSTRUMENTS")
	now := env.now()
	for _, s := range list {
		exp := "-"
		if s.Expires != nil {
			exp = s.Expires.Sub(now).Round(time.Second).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%v\t%s\n", s.Name, s.ID, now.Sub(s.Created).Round(time.Second), exp, s.Tied, instruments(s))
	}
	return tw.Flush()
}

// instruments summarises what a session has installed, with totals.
func instruments(s api.Session) string {
	var parts []string
	for _, t := range s.Timers {
		p := fmt.Sprintf("time %s (%d calls, %s wall", t.Function, t.Calls, fmtNS(t.WallNS))
		if t.Filter != "" {
			p += ", " + t.Filter
		}
		parts = append(parts, p+")")
	}
	for _, p := range s.Probes {
		parts = append(parts, fmt.Sprintf("count %s (%d)", location(p.Resolved), p.Count))
	}
	if s.Cover != nil {
		parts = append(parts, coverSummary(s.Cover))
	}
	return strings.Join(parts, "; ")
}

// Detach removes a session by name or ID (`kinst detach`) and prints its
// final totals.
func Detach(ctx context.Context, c *api.Client, name string, asJSON bool, env Env) error {
	stdout := env.Out
	start := env.now()
	s, err := c.RemoveSession(ctx, name)
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(stdout, s)
	}
	fmt.Fprintf(stdout, "detached %s (%s) in %v: %s\n", s.Name, s.ID, env.since(start).Round(time.Microsecond), instruments(s))
	return nil
}
