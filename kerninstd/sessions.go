package kerninstd

import (
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/kinst/kinst/api"
)

// ErrNameTaken is returned when a live session already has the name.
var ErrNameTaken = errors.New("session name in use")

// checkName refuses a name another live session has (as its name or ID).
// The caller holds d.mu.
func (d *Daemon) checkName(name string) error {
	if other := d.findLocked(name); other != nil {
		return badRequest(fmt.Errorf("%w: %q (session %s); detach it first", ErrNameTaken, name, other.id))
	}
	return nil
}

// findLocked finds a session by ID, then by name. The caller holds d.mu.
func (d *Daemon) findLocked(idOrName string) *session {
	if ss, ok := d.sessions[idOrName]; ok {
		return ss
	}
	for _, ss := range d.sessions {
		if ss.name == idOrName {
			return ss
		}
	}
	return nil
}

// startTTL arranges for ss to remove itself after ttl. The caller holds
// d.mu.
func (d *Daemon) startTTL(ss *session, ttl time.Duration) {
	if ttl <= 0 {
		return
	}
	ss.expires = ss.created.Add(ttl)
	ss.expiry = time.AfterFunc(ttl, func() {
		if _, err := d.RemoveSession(ss.id); err != nil {
			if !errors.Is(err, ErrNoSession) {
				d.log.Error("remove expired session", "session", ss.id, "err", err)
			}
			return
		}
		d.log.Info("session expired; instrumentation removed", "session", ss.id, "name", ss.name, "ttl", ttl)
	})
}

// TiedGrace is how long a tied session waits for its client's sample
// stream before it is removed as unclaimed. A variable for the tests.
var TiedGrace = 30 * time.Second

// claimWithin removes the tied session id if no sample stream has been
// opened for it after grace.
func (d *Daemon) claimWithin(id string, grace time.Duration) {
	time.AfterFunc(grace, func() {
		d.mu.Lock()
		ss := d.findLocked(id)
		unclaimed := ss != nil && ss.id == id && !ss.streamed
		d.mu.Unlock()
		if unclaimed {
			d.removeUnclaimed(id, fmt.Sprintf("no sample stream within %s", grace))
		}
	})
}

// removeUnclaimed removes a tied session its client will never end.
func (d *Daemon) removeUnclaimed(id, why string) {
	if _, err := d.RemoveSession(id); err != nil {
		if !errors.Is(err, ErrNoSession) {
			d.log.Error("remove unclaimed tied session", "session", id, "err", err)
		}
		return
	}
	d.log.Info("tied session removed", "session", id, "why", why)
}

// Sessions describes every live session, oldest first, with current
// totals.
func (d *Daemon) Sessions() []api.Session {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]api.Session, 0, len(d.sessions))
	for _, ss := range d.sessions {
		out = append(out, d.describe(ss))
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Created.Equal(out[j].Created) {
			return out[i].Created.Before(out[j].Created)
		}
		return out[i].ID < out[j].ID
	})
	return out
}
