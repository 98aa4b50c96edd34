//go:build tools

// Package tools pins the Vault server that the acceptance tests and the dev
// server run. It is a separate module so the plugin itself links only the
// MPL-licensed sdk, never the BUSL-licensed server.
package tools

import (
	_ "github.com/hashicorp/vault"
)
