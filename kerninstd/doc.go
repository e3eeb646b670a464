// Package kerninstd is the privileged daemon: it keeps the sessions
// (counters, timers, waiters) and their time-to-live, asks the splice
// planner (package splice) where and how to splice and the splicing
// engine (package engine) to do it, runs and caches the whole-kernel
// analysis (package census), serves Prometheus /metrics, and serves the
// HTTP/JSON API that the kinst command talks to (over a unix socket,
// optionally loopback TCP).
//
// Every splice belongs to a session. A session created "tied" lives only as
// long as the client's sample stream: if the client goes away (Ctrl-C,
// kill -9, a dropped connection), its splices are removed. If kerninstd
// itself dies, the driver restores every byte when the device is closed.
//
// Lock order: Daemon.mu (sessions) before the engine's lock.
package kerninstd
