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
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/vault/sdk/plugin"

	awsresilient "github.com/aws-resilient/vault-plugin-secrets-aws-resilient"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/memlimit"
)

// version is replaced by -ldflags "-X main.version=<semver>".
var version = awsresilient.DevVersion

// defaultMemoryLimit is the Go runtime's soft memory limit when the operator
// sets none (GOMEMLIMIT, e.g. through `vault plugin register -env`). With the
// default GOGC alone the heap may grow to twice the live heap and freed pages
// go back to the OS slowly: 10 000 cached roles (~17 MB live) then cost about
// 78 MiB of RSS; with this limit about 55 MiB (BENCHMARKS.md, section e), for
// some more GC work during a mass refresh. It is soft, and the plugin
// raises it above what the runtime holds (the live heap and the runtime's
// overhead) plus an eighth of the live heap when the cache outgrows it
// (memlimit.Adapt): at 100 000 roles a limit below that kept one of two
// cores busy with GC.
const defaultMemoryLimit = 32 << 20

func main() {
	if len(os.Args) == 2 && (os.Args[1] == "-version" || os.Args[1] == "--version") {
		fmt.Println(version)
		return
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		// The limit is the plugin's own, so a large response may lend
		// itself headroom above it; an operator's GOMEMLIMIT is left alone.
		memlimit.Own(defaultMemoryLimit)
		// It follows the live heap, so that a large cache does not keep
		// the GC running without pause; every second, so that a mount
		// start loading 100 000 roles (a few MiB a second) does not outrun
		// the headroom between two adaptations. A read of the runtime's
		// figures costs microseconds.
		go memlimit.Adapt(time.Second)
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
