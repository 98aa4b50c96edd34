//go:build race

package awsresilient

// simRace: the race detector makes each step of the simulation several
// times slower, so a run under -race takes fewer steps by default.
const simRace = true
