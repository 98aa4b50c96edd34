package vaulttest

import (
	"os"
	"path/filepath"
	"testing"
)

// CredentialsHelperBin builds cmd/aws-resilient-credentials (or returns
// $CREDENTIALS_HELPER_BIN).
func CredentialsHelperBin(tb testing.TB) string {
	tb.Helper()
	return builtCommand(tb, "CREDENTIALS_HELPER_BIN", "aws-resilient-credentials", "./cmd/aws-resilient-credentials")
}

// SDKClientBin builds internal/sdkclient, the long-running aws-sdk-go-v2
// application the acceptance tests give credentials to (or returns
// $SDK_CLIENT_BIN).
func SDKClientBin(tb testing.TB) string {
	tb.Helper()
	return builtCommand(tb, "SDK_CLIENT_BIN", "sdkclient", "./internal/sdkclient")
}

// builtCommand builds the main package pkg once per test binary into a
// file named name, unless the environment variable env names a binary.
func builtCommand(tb testing.TB, env, name, pkg string) string {
	tb.Helper()
	root := RepoRoot(tb)
	return builtBinary(tb, name, func(dir string) (string, error) {
		if p := os.Getenv(env); p != "" {
			return p, nil
		}
		out := filepath.Join(dir, name)
		return out, goBuild(root, out, pkg)
	})
}
