//go:build !nobudget

package awsresilient

// readerBudgetBuilt: readers are held to one STS call per key per retry
// block (flights.read), and a failing key's calls go at best effort in the
// rate limiter. Only the benchmark's baseline build (-tags nobudget) turns
// it off, to measure the behaviour without it beside the one with it.
const readerBudgetBuilt = true
