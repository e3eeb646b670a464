// Package api is kerninstd's wire protocol: the JSON types of its HTTP
// API (sessions, samples, CFGs, coverage reports, the census) and a
// client for it. The reports of the commands kerninstd does not serve
// (kinst count, time, core, offcpu, …) are package output's. The JSON
// field names and shapes here are stable interfaces (see docs/json.md);
// the package imports only the standard library, so programs can drive
// kerninstd without the rest of kinst.
package api
