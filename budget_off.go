//go:build nobudget

package awsresilient

// readerBudgetBuilt is false in the benchmark's baseline build only: every
// cold read joins or starts a cycle whose first attempt goes at once, as
// before the read budget (BENCHMARKS.md, section h).
const readerBudgetBuilt = false
