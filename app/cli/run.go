package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/procsession"
)

// runOptions say how long a session's report runs.
type runOptions struct {
	Duration time.Duration // 0: until Ctrl-C or the command exits
	Interval time.Duration
	Command  []string // run this and report for its lifetime
	// Started is a command already started (a process kinst splices,
	// started stopped and let go): the run reports for its lifetime.
	Started Process
	// RunOn: when the samples end before the command does (a process
	// that ran exec), the run waits for the command, which is what the
	// user asked to run.
	RunOn   bool
	Waiting string // printed when neither bounds the run
}

// runResult is how a run ended.
type runResult struct {
	ExitStatus *int // of the command, if one ran
	// DurationEnded: the run's --duration ended the command (kinst sent
	// it SIGTERM), so that its status says how it was stopped, not how
	// the run went: kinst exits 0. Not set when the command was ended
	// for another reason (its session removed elsewhere).
	DurationEnded bool
	Duration      time.Duration
	Final         api.Session   // with final totals; the session is removed
	Detach        time.Duration // how long the removal took
}

// status is the command's exit status, 0 when none ran: what kinst exits
// with after a run.
func (r runResult) status() int {
	if r.ExitStatus != nil && !r.DurationEnded {
		return *r.ExitStatus
	}
	return 0
}

// sampleChan delivers stream's samples; it is closed when the stream
// ends.
func sampleChan(stream interface{ Next() (api.Sample, error) }) <-chan api.Sample {
	samples := make(chan api.Sample)
	go func() {
		defer close(samples)
		for {
			s, err := stream.Next()
			if err != nil {
				return
			}
			samples <- s
		}
	}()
	return samples
}

// interruptGrace is how long a command has to end after the SIGINT that
// stopped kinst before kinst passes it on: a terminal's Ctrl-C reaches
// both, and a second SIGINT could cut short what the first began.
const interruptGrace = time.Second

// command starts the run's command, or takes the one started, and
// delivers its exit status; with neither, it says how the run ends.
func (o runOptions) command(env Env) (Process, <-chan int, error) {
	cmd := o.Started
	if cmd == nil && len(o.Command) > 0 {
		var err error
		if cmd, err = env.start(o.Command); err != nil {
			return nil, nil, fmt.Errorf("start %s: %w", o.Command[0], err)
		}
	}
	done := make(chan int, 1)
	if cmd == nil {
		if o.Duration == 0 && o.Waiting != "" {
			fmt.Fprintln(env.Err, o.Waiting)
		}
		return nil, done, nil
	}
	go func() { done <- cmd.Wait() }()
	return cmd, done, nil
}

// runSession streams the session's samples to onSample until the
// duration ends, the command exits or a signal arrives, then removes the
// session. The sample stream ties the session to this process: if kinst
// dies, kerninstd removes its splices.
func runSession(ctx context.Context, c sessionHost, sess api.Session, o runOptions, env Env,
	onSample func(elapsed time.Duration, s api.Sample)) (runResult, error) {
	var res runResult
	var last api.Sample // the latest totals, for a session removed elsewhere
	remove := func() { c.RemoveSession(context.WithoutCancel(ctx), sess.ID) }
	stream, err := c.Samples(context.WithoutCancel(ctx), sess.ID, o.Interval)
	if err != nil {
		remove()
		return res, err
	}
	defer stream.Close()
	samples := sampleChan(stream)

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sig)

	// The run starts before the command does, so the whole of its life
	// is inside the run, and before the deadline is set.
	start := env.now()
	cmd, cmdDone, err := o.command(env)
	if err != nil {
		remove()
		st := 127
		res.ExitStatus = &st
		return res, err
	}
	var deadline <-chan time.Time
	if o.Duration > 0 {
		deadline = env.after(o.Duration)
	}
	exited := func(st int) { res.ExitStatus = &st }
loop:
	for {
		select {
		case s, ok := <-samples:
			if !ok {
				if o.RunOn && cmd != nil {
					samples = nil // no more: wait for the command
					continue
				}
				break loop
			}
			onSample(s.Time.Sub(start), s)
			last = s
			if env.sampled != nil {
				env.sampled()
			}
		case st := <-cmdDone:
			exited(st)
			break loop
		case <-deadline:
			res.DurationEnded = cmd != nil // the command, still running, is ended below
			break loop
		case sg := <-sig:
			if cmd != nil {
				// The terminal sent the command the same SIGINT; a
				// SIGTERM is passed on, and so is a SIGINT sent to kinst
				// alone (kill -INT, timeout -s INT) when the command is
				// still there a moment later. Report until it is gone.
				if sg == syscall.SIGTERM {
					cmd.Signal(sg)
				}
				select {
				case st := <-cmdDone:
					exited(st)
				case <-env.after(interruptGrace):
					cmd.Signal(sg)
					exited(<-cmdDone)
				}
			}
			break loop
		}
	}
	if cmd != nil && res.ExitStatus == nil {
		// --duration ended first: a bounded run must end.
		cmd.Signal(syscall.SIGTERM)
		exited(<-cmdDone)
	}
	res.Duration = env.since(start)
	res, err = detachRun(ctx, c, sess.ID, env, res)
	if !isNoSession(err) {
		return res, err
	}
	// Removed by another client (kinst detach, its TTL): the last totals
	// seen stand for the final ones; a coverage session's report went
	// with that removal.
	if sess.Cover != nil || last.Time.IsZero() {
		return res, fmt.Errorf("session %s was removed elsewhere (kinst detach, or its --ttl) before kinst read its final state: that removal's answer had it", sess.Name)
	}
	fmt.Fprintf(env.Err, "kinst: session %s was removed elsewhere (kinst detach, or its --ttl): the totals are those of %s\n", sess.Name, last.Time.Format("15:04:05.000"))
	res.Final = finalFromSample(sess, last)
	return res, nil
}

// isNoSession: err says the session is gone (kerninstd's no_session, a
// process host's ErrNoSession).
func isNoSession(err error) bool {
	var ae *api.APIError
	return errors.As(err, &ae) && ae.Code == api.CodeNoSession || errors.Is(err, procsession.ErrNoSession)
}

// finalFromSample is sess with the totals of sample s.
func finalFromSample(sess api.Session, s api.Sample) api.Session {
	out := sess
	out.Probes = slices.Clone(sess.Probes)
	for i := range out.Probes {
		if i < len(s.Totals) {
			out.Probes[i].Count = s.Totals[i]
		}
	}
	out.Timers = slices.Clone(sess.Timers)
	for i := range out.Timers {
		if i < len(s.Timers) {
			out.Timers[i].Totals = s.Timers[i]
		}
	}
	return out
}

// detachRun removes a run's session, timing it: res with its final
// state.
func detachRun(ctx context.Context, c sessionHost, id string, env Env, res runResult) (runResult, error) {
	detach := env.now()
	final, err := c.RemoveSession(context.WithoutCancel(ctx), id)
	res.Detach = env.since(detach)
	if err != nil {
		return res, fmt.Errorf("remove instrumentation: %w", err)
	}
	res.Final = final
	return res, nil
}
