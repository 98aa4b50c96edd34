package acceptance

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sts"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

func TestMain(m *testing.M) { os.Exit(vaulttest.Main(m)) }

const mount = vaulttest.MountPath

// roleARN is a role in the emulator's account, so it is assumable.
func roleARN(name string) string {
	return "arn:aws:iam::" + vaulttest.EmulatorAccount + ":role/" + name
}

// stack is one emulator and one Vault server with the plugin mounted and
// pointed at the emulator.
type stack struct {
	emu   *vaulttest.Emulator
	vault *vaulttest.Server
}

// newDevStack starts an emulator with emuFlags and a dev server with the
// plugin mounted, configured with config/root pointing at the emulator and
// the given config/refresh fields.
func newDevStack(t *testing.T, emuFlags []string, refresh map[string]string) *stack {
	t.Helper()
	emu := vaulttest.StartEmulator(t, emuFlags...)
	v := vaulttest.StartDev(t)
	v.SetupPlugin(t, vaulttest.DefaultPluginVersion)
	v.ConfigureEmulator(t, emu, refresh)
	return &stack{emu: emu, vault: v}
}

// createRole writes an assumed_role role for roleARN(name) plus extra fields.
func (s *stack) createRole(t *testing.T, name string, extra ...string) {
	t.Helper()
	args := append([]string{"write", mount + "/roles/" + name, "credential_type=assumed_role", "role_arn=" + roleARN(name)}, extra...)
	s.vault.CLI(t, args...)
}

// assumeRoleCalls counts AssumeRole calls the emulator answered, by outcome
// ("" = all).
func (s *stack) assumeRoleCalls(t *testing.T, outcome string) int {
	t.Helper()
	return s.emu.Stats(t).Count("AssumeRole", outcome)
}

// creds is a credential as `vault read -format=json <mount>/creds/<role>` returns it.
type creds struct {
	AccessKey, SecretKey, SecurityToken string
	Expiration                          time.Time
	ARN                                 string
	LeaseDuration                       time.Duration
	Renewable                           bool
	LeaseID                             string
}

func credsFrom(t *testing.T, sec *vaulttest.Secret) creds {
	t.Helper()
	c := creds{
		AccessKey:     sec.Str("access_key"),
		SecretKey:     sec.Str("secret_key"),
		SecurityToken: sec.Str("security_token"),
		ARN:           sec.Str("arn"),
		LeaseDuration: time.Duration(sec.LeaseDuration) * time.Second,
		Renewable:     sec.Renewable,
		LeaseID:       sec.LeaseID,
	}
	exp, err := time.Parse(time.RFC3339, sec.Str("expiration"))
	if err != nil {
		t.Fatalf("creds: expiration %q is not RFC 3339: %v", sec.Str("expiration"), err)
	}
	c.Expiration = exp
	return c
}

// readCreds reads <mount>/creds/<role> with the CLI and checks the shape
// every credential must have: all parts present and not expired.
func (s *stack) readCreds(t *testing.T, role string) creds {
	t.Helper()
	c := credsFrom(t, s.vault.Read(t, mount+"/creds/"+role))
	checkUsable(t, c)
	return c
}

// checkUsable fails the test if c is empty or already expired: the plugin
// must never serve either.
func checkUsable(t *testing.T, c creds) {
	t.Helper()
	if !strings.HasPrefix(c.AccessKey, "ASIA") || c.SecretKey == "" || c.SecurityToken == "" {
		t.Fatalf("credential incomplete: access_key %q, secret_key set %v, security_token set %v",
			c.AccessKey, c.SecretKey != "", c.SecurityToken != "")
	}
	if !c.Expiration.After(time.Now()) {
		t.Fatalf("credential %s served at %s expired at %s", c.AccessKey, time.Now().UTC().Format(time.RFC3339), c.Expiration.Format(time.RFC3339))
	}
}

// callerIdentity signs GetCallerIdentity with c and sends it to the
// emulator with the real SDK: proof that the credential is one the emulator
// issued and still accepts. It returns the ARN the emulator reports.
func (s *stack) callerIdentity(t *testing.T, c creds) (string, error) {
	t.Helper()
	return callerIdentityAt(s.emu.URL, c.AccessKey, c.SecretKey, c.SecurityToken)
}

// callerIdentityAt is callerIdentity against the emulator at url.
func callerIdentityAt(url, accessKey, secretKey, sessionToken string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client := sts.New(sts.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(url),
		Credentials:  credentials.NewStaticCredentialsProvider(accessKey, secretKey, sessionToken),
		Retryer:      aws.NopRetryer{},
	})
	out, err := client.GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
	if err != nil {
		return "", err
	}
	return aws.ToString(out.Arn), nil
}

// mustBeValid checks with the emulator that c is accepted.
func (s *stack) mustBeValid(t *testing.T, c creds) {
	t.Helper()
	if _, err := s.callerIdentity(t, c); err != nil {
		t.Fatalf("credential %s is not accepted by the emulator: %v", c.AccessKey, err)
	}
}

// eventually polls cond every interval until it returns true or timeout
// passes; the last message from cond explains a failure.
func eventually(t *testing.T, timeout, interval time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, msg := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s: %s", timeout, msg)
		}
		time.Sleep(interval)
	}
}

// statusOf reads <mount>/status/<role>.
func (s *stack) statusOf(t *testing.T, role string) *vaulttest.Secret {
	t.Helper()
	return s.vault.Read(t, mount+"/status/"+role)
}

// parseTime parses a status time field (RFC 3339); zero when empty.
func parseTime(t *testing.T, sec *vaulttest.Secret, field string) time.Time {
	t.Helper()
	v := sec.Str(field)
	if v == "" {
		return time.Time{}
	}
	ts, err := time.Parse(time.RFC3339, v)
	if err != nil {
		t.Fatalf("status field %s = %q is not RFC 3339: %v", field, v, err)
	}
	return ts
}

// redact removes lines that carry a secret from command output before it
// goes into a failure message.
func redact(out string) string {
	var keep []string
	for _, l := range strings.Split(out, "\n") {
		ll := strings.ToLower(l)
		if strings.Contains(ll, "secret_key") || strings.Contains(ll, "security_token") || strings.Contains(ll, "token ") || strings.Contains(ll, "vault_token") {
			l = fmt.Sprintf("<line with a secret removed (%d bytes)>", len(l))
		}
		keep = append(keep, l)
	}
	return strings.Join(keep, "\n")
}
