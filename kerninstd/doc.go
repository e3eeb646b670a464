// Package kerninstd is the privileged daemon: it owns the driver, resolves
// instrumentation points against the live kernel, builds and verifies
// patches, installs and removes splices, and serves the HTTP/JSON API that
// the kinst command talks to (over a unix socket, optionally loopback TCP).
//
// Every splice belongs to a session. A session created "tied" lives only as
// long as the client's sample stream: if the client goes away (Ctrl-C,
// kill -9, a dropped connection), its splices are removed. If kerninstd
// itself dies, the driver restores every byte when the device is closed.
package kerninstd
