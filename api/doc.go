// Package api is kinst's public contract: the JSON types of kerninstd's
// HTTP API and a client for it, and the report types every `kinst …
// --json` prints. The JSON field names and shapes here are stable
// interfaces (see docs/json.md); the package imports only the standard
// library, so programs can drive kerninstd or read kinst's reports without
// the rest of kinst.
package api
