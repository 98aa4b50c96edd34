//go:build !race

package awsresilient

// simRace: see sim_race_test.go.
const simRace = false
