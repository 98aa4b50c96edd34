// Command aws-resilient-credentials hands the aws-resilient plugin's
// credentials to any AWS SDK, in the two ways every SDK refreshes by itself:
//
//	aws-resilient-credentials credential-process --role app
//	    prints the credential_process JSON (name it in ~/.aws/config:
//	    credential_process = aws-resilient-credentials credential-process --role app)
//
//	aws-resilient-credentials serve --role app [--listen 127.0.0.1:9911]
//	    serves the container credentials endpoint
//	    (AWS_CONTAINER_CREDENTIALS_FULL_URI with
//	    AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE), keeping the last good
//	    credential in memory and reading Vault again before it is stale.
//
// Vault is reached like the vault CLI reaches it: VAULT_ADDR, VAULT_CACERT,
// VAULT_NAMESPACE and the other VAULT_* variables; the token comes from
// --token-file (a Vault Agent sink), VAULT_TOKEN or ~/.vault-token, or from
// a Vault Agent or Proxy listener with use_auto_auth_token when none is set.
// Nothing it prints to stderr ever holds a secret.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/credhelper"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/flaghint"
)

// version is replaced by -ldflags "-X main.version=<semver>".
var version = "v0.0.0-dev"

const usage = `usage:
  aws-resilient-credentials credential-process --role NAME [--mount PATH] [--token-file FILE]
  aws-resilient-credentials serve --role NAME [--mount PATH] [--token-file FILE]
        [--listen 127.0.0.1:9911] [--auth-token-file FILE] [--allow-remote]
  aws-resilient-credentials version

Vault is reached through VAULT_ADDR, VAULT_CACERT, VAULT_NAMESPACE, ... as for
the vault CLI; the token is read from --token-file, VAULT_TOKEN or
~/.vault-token (none: a Vault Agent/Proxy listener with use_auto_auth_token).
`

func main() {
	// serve runs until SIGTERM or SIGINT; credential-process ends by itself.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run is the command line: it returns the exit status (2 for a usage
// error); serve stops when ctx ends.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "credential-process":
		return credentialProcess(ctx, args[1:], stdout, stderr)
	case "serve":
		return serve(ctx, args[1:], stderr)
	case "version", "-version", "--version":
		fmt.Fprintln(stdout, version)
		return 0
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "aws-resilient-credentials: unknown command %q\n%s", args[0], usage)
	return 2
}

// common are the flags both commands take.
type common struct {
	mount, role, tokenFile string
}

func (c *common) register(fs *flag.FlagSet) {
	fs.StringVar(&c.mount, "mount", "aws-resilient", "the path the plugin is mounted at")
	fs.StringVar(&c.role, "role", "", "the role to read: <mount>/creds/<role> (required)")
	fs.StringVar(&c.tokenFile, "token-file", "", "a file holding the Vault token, read before every request (a Vault Agent sink)")
}

func (c *common) parse(fs *flag.FlagSet, args []string, stderr io.Writer) (*credhelper.Reader, int) {
	// flag's own answer to a mistake is the error and every flag's
	// default; the error with what to do is shorter and says more.
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(stderr, "usage of aws-resilient-credentials %s:\n", fs.Name())
			fs.SetOutput(stderr)
			fs.PrintDefaults()
		} else {
			fmt.Fprintf(stderr, "aws-resilient-credentials %s: %s\n", fs.Name(), flagError(fs, err))
		}
		return nil, 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "aws-resilient-credentials %s: unexpected argument %q\n", fs.Name(), fs.Arg(0))
		return nil, 2
	}
	if c.role == "" {
		fmt.Fprintf(stderr, "aws-resilient-credentials %s: --role is required (the role under <mount>/roles/)\n", fs.Name())
		return nil, 2
	}
	if err := credhelper.CheckRole(c.role); err != nil {
		fmt.Fprintf(stderr, "aws-resilient-credentials %s: %v\n", fs.Name(), err)
		return nil, 2
	}
	r, err := credhelper.NewReader(c.mount, c.role, c.tokenFile)
	if err != nil {
		fmt.Fprintf(stderr, "aws-resilient-credentials: %v\n", err)
		return nil, 1
	}
	return r, 0
}

// credentialProcess prints one credential as credential_process JSON, or on
// any failure nothing on stdout and the reason on stderr.
func credentialProcess(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var c common
	fs := flag.NewFlagSet("credential-process", flag.ContinueOnError)
	c.register(fs)
	r, code := c.parse(fs, args, stderr)
	if r == nil {
		return code
	}
	cred, err := r.Read(ctx)
	now := time.Now()
	if err == nil && !credhelper.Servable(cred, now) {
		err = fmt.Errorf("Vault served credential %s that expires at %s: too close to expiry to use", cred.AccessKeyID, cred.Expiration.UTC().Format(time.RFC3339))
	}
	if err != nil {
		fmt.Fprintf(stderr, "aws-resilient-credentials: %v\n", err)
		return 1
	}
	// The credential is good, but an SDK that holds it will run this
	// helper again at every call: say so where a person may see it
	// (aws-sdk-go-v2 passes the helper's stderr on; botocore shows it only
	// on a failure).
	if w := credhelper.ProcessRunWarning(cred, now); w != "" {
		fmt.Fprintf(stderr, "aws-resilient-credentials: %s\n", w)
	}
	// The Expiration printed is on this host's clock; say so when it
	// differs from AWS's, as the host's clock then needs fixing.
	if note := credhelper.ClockNote(cred); note != "" {
		fmt.Fprintf(stderr, "aws-resilient-credentials: %s\n", note)
	}
	out, err := credhelper.ProcessJSON(cred)
	if err != nil {
		fmt.Fprintf(stderr, "aws-resilient-credentials: encoding the credential: %v\n", err)
		return 1
	}
	stdout.Write(append(out, '\n'))
	return 0
}

// serveOptions are serve's flags.
type serveOptions struct {
	common
	listen, authFile string
	allowRemote      bool
}

// serveFlags is serve's flag set, writing into o; its defaults are the
// documented ones.
func serveFlags(o *serveOptions) *flag.FlagSet {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	o.register(fs)
	fs.StringVar(&o.listen, "listen", "127.0.0.1:9911", "address to listen on; loopback unless --allow-remote")
	fs.StringVar(&o.authFile, "auth-token-file", "", "file with the token clients must send in Authorization; created with a random token when missing, used only when owned by this user and closed to group and others, never through a symbolic link (default: a new file in a private temporary directory, removed on exit)")
	fs.BoolVar(&o.allowRemote, "allow-remote", false, "allow a --listen address other hosts can reach")
	return fs
}

// serve runs the container credentials endpoint until ctx ends.
func serve(ctx context.Context, args []string, stderr io.Writer) int {
	var o serveOptions
	r, code := o.parse(serveFlags(&o), args, stderr)
	if r == nil {
		return code
	}
	logf := func(format string, a ...any) {
		fmt.Fprintf(stderr, time.Now().UTC().Format(time.RFC3339)+" aws-resilient-credentials: "+format+"\n", a...)
	}
	if err := credhelper.CheckListen(o.listen, o.allowRemote); err != nil {
		logf("%v", err)
		return 2
	}
	authFile := o.authFile
	if authFile == "" {
		dir, err := os.MkdirTemp("", "aws-resilient-credentials-")
		if err != nil {
			logf("creating a directory for the authorization token: %v", err)
			return 1
		}
		defer os.RemoveAll(dir)
		authFile = filepath.Join(dir, "token")
	}
	token, created, err := credhelper.LoadOrCreateToken(authFile)
	if err != nil {
		logf("%v", err)
		return 1
	}
	if created {
		defer os.Remove(authFile)
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		logf("listening on %s: %v", o.listen, err)
		return 1
	}

	ctx, stop := context.WithCancel(ctx)
	defer stop()
	cache := credhelper.NewCache(ctx, r.Read, clock.Real{}, rand.Float64)
	srv := credhelper.NewServer(&credhelper.Handler{Cache: cache, AuthToken: token})
	url := "http://" + ln.Addr().String() + "/"
	logf("serving %s at %s\n  export AWS_CONTAINER_CREDENTIALS_FULL_URI=%s\n  export AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE=%s", r.Path(), url, url, authFile)

	done := make(chan struct{})
	go func() {
		defer close(done)
		cache.Run(ctx, func(cr credhelper.Credential, err error) {
			if err != nil {
				logf("reading %s failed: %v; next read at %s", r.Path(), err, cache.NextRead().UTC().Format(time.RFC3339))
				return
			}
			logf("read credential %s expiring at %s; next read at %s", cr.AccessKeyID, cr.Expiration.UTC().Format(time.RFC3339), cache.NextRead().UTC().Format(time.RFC3339))
			if note := credhelper.ClockNote(cr); note != "" {
				logf("%s", note)
			}
		})
	}()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	select {
	case err := <-served:
		logf("serving stopped: %v", err)
		stop()
		<-done
		return 1
	case <-ctx.Done():
	}
	logf("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		logf("shutdown: %v", err)
	}
	<-done
	return 0
}

// flagError is a flag parse error with what to do (flaghint.Explain).
func flagError(fs *flag.FlagSet, err error) string {
	return flaghint.Explain(fs, err, "--", "aws-resilient-credentials help lists the commands and their flags")
}
