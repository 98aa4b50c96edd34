// Command vault-plugin-secrets-aws-resilient is the Vault plugin binary of
// the aws-resilient secrets engine.
//
// The version it reports to Vault (RunningVersion, which must equal the
// -version given to `vault plugin register`) is set at build time:
//
//	go build -ldflags "-X main.version=v0.1.0" ./cmd/vault-plugin-secrets-aws-resilient
//
// Without -ldflags it reports v0.0.0-dev. `vault-plugin-secrets-aws-resilient
// -version` prints it and exits.
package main

import (
	"fmt"
	"os"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/vault/sdk/plugin"

	awsresilient "github.com/aws-resilient/vault-plugin-secrets-aws-resilient"
)

// version is replaced by -ldflags "-X main.version=<semver>".
var version = awsresilient.DevVersion

func main() {
	if len(os.Args) == 2 && (os.Args[1] == "-version" || os.Args[1] == "--version") {
		fmt.Println(version)
		return
	}
	// No TLSProviderFunc: Vault 1.12 and later connect to plugins with
	// automatic mTLS, so the plugin needs neither the api package nor the
	// legacy -ca-cert flags.
	if err := plugin.ServeMultiplex(&plugin.ServeOpts{
		BackendFactoryFunc: awsresilient.FactoryWithVersion(version),
	}); err != nil {
		logger := hclog.New(&hclog.LoggerOptions{})
		logger.Error("plugin shutting down", "error", err)
		os.Exit(1)
	}
}
