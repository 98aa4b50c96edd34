// Package stsemu is an AWS STS stand-in for tests, the dev server and
// benchmarks. It speaks the STS Query API (form-encoded POST, XML responses
// in AWS's shapes), verifies SigV4 signatures against a root key pair and
// every temporary credential it has issued, and fails on demand: token-bucket
// throttling, scripted or random faults (throttling, 5xx, connection resets,
// hangs, malformed XML, expired or empty credentials, AccessDenied) and
// response latency. Counters and a per-second timeline of calls are readable
// from Go (Stats, Calls) and over a small JSON control API under /_emulator/.
//
// Use Start in Go tests (it listens on a random loopback port) or New to get
// a plain http.Handler; cmd/sts-emulator wraps it as a binary.
package stsemu
