// Package output holds the JSON documents kinst's commands print with
// --json that kerninstd does not serve: the reports of count, time,
// watch, the benches, core, offcpu, unwind, vm and driver status, cover
// diff. Each is a stable interface (see docs/json.md). The package
// imports only the standard library and api (whose types some reports
// embed: addresses, resolved points), so a program can read kinst's
// reports without the rest of kinst.
package output
