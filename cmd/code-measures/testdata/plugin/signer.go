package plugin

import "github.com/aws-resilient/vault-plugin-secrets-aws-resilient/cmd/code-measures/testdata/plugin/sdk"

// signer implements the SDK's interface.
type signer struct{}

// Sign implements sdk.Signer: its six parameters are the SDK's, so they are
// not counted.
func (signer) Sign(a, b, c, d, e, f int) error { return nil }

// impostor claims the interface in a comment but does not implement it
// (Sign has another signature): its long list is counted.
type impostor struct{}

// Sign implements sdk.Signer, it says: counted all the same.
func (impostor) Sign(a, b, c, d, e, f int, g string) error { return nil }

var _ sdk.Signer = signer{}
