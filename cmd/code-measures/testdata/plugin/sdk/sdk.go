// Package sdk stands for a third-party SDK whose interface dictates a long
// parameter list (aws-sdk-go-v2's HTTPSignerV4 has eight).
package sdk

// Signer is the SDK's interface.
type Signer interface {
	Sign(a, b, c, d, e, f int) error
}
