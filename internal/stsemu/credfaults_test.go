package stsemu

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	"github.com/aws/aws-sdk-go-v2/service/sts/types"
)

// postFaults sets a fault plan through the control API, as a test driving
// the emulator binary does, and returns the plan the emulator reports.
func postFaults(t *testing.T, e *Emulator, body string) map[string]any {
	t.Helper()
	resp, err := http.Post(e.URL()+"/_emulator/faults", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /_emulator/faults %s: %d %s", body, resp.StatusCode, raw)
	}
	var plan map[string]any
	if err := json.Unmarshal(raw, &plan); err != nil {
		t.Fatal(err)
	}
	return plan
}

// issuingCall is one of STS's credential-issuing actions through the real
// SDK client, its Credentials element as the SDK parsed it.
type issuingCall struct {
	action string
	call   func(c *sts.Client) (*types.Credentials, error)
}

var issuingCalls = []issuingCall{
	{"AssumeRole", func(c *sts.Client) (*types.Credentials, error) {
		out, err := c.AssumeRole(ctx, assumeInput("app"))
		if err != nil {
			return nil, err
		}
		return out.Credentials, nil
	}},
	{"GetSessionToken", func(c *sts.Client) (*types.Credentials, error) {
		out, err := c.GetSessionToken(ctx, &sts.GetSessionTokenInput{})
		if err != nil {
			return nil, err
		}
		return out.Credentials, nil
	}},
	{"GetFederationToken", func(c *sts.Client) (*types.Credentials, error) {
		out, err := c.GetFederationToken(ctx, &sts.GetFederationTokenInput{Name: aws.String("fed")})
		if err != nil {
			return nil, err
		}
		return out.Credentials, nil
	}},
}

// TestCredentialShapesWithSDK sets each credential shape through the
// control API for one call and checks what the real aws-sdk-go-v2 client
// parses from the answer of each issuing action: exactly the one field
// bent, the rest a working credential, the call logged under the fault's
// name, and the next call normal again.
func TestCredentialShapesWithSDK(t *testing.T) {
	// Each check gets the parsed credential and the instant of the call.
	checks := map[Fault]func(t *testing.T, e *Emulator, c *types.Credentials, now time.Time){
		FaultEmptyKey: func(t *testing.T, _ *Emulator, c *types.Credentials, _ time.Time) {
			if got := aws.ToString(c.AccessKeyId); got != "" {
				t.Errorf("AccessKeyId = %q, want empty", got)
			}
		},
		FaultEmptySecret: func(t *testing.T, _ *Emulator, c *types.Credentials, _ time.Time) {
			if got := aws.ToString(c.SecretAccessKey); got != "" {
				t.Errorf("SecretAccessKey = %q, want empty", got)
			}
		},
		FaultEmptyToken: func(t *testing.T, _ *Emulator, c *types.Credentials, _ time.Time) {
			if got := aws.ToString(c.SessionToken); got != "" {
				t.Errorf("SessionToken = %d characters, want empty", len(got))
			}
		},
		FaultNoExpiration: func(t *testing.T, _ *Emulator, c *types.Credentials, _ time.Time) {
			// What the plugin gets from aws.ToTime: the zero time.
			if c.Expiration != nil {
				t.Errorf("Expiration = %v, want none (nil)", *c.Expiration)
			}
		},
		FaultExpired: func(t *testing.T, _ *Emulator, c *types.Credentials, now time.Time) {
			if exp := aws.ToTime(c.Expiration); !exp.Before(now) {
				t.Errorf("Expiration = %v, want before %v", exp, now)
			}
		},
		FaultFarExpiration: func(t *testing.T, e *Emulator, c *types.Credentials, now time.Time) {
			if exp := aws.ToTime(c.Expiration); exp.Before(now.Add(FarExpiration - time.Second)) {
				t.Errorf("Expiration = %v, want about %v after %v", exp, FarExpiration, now)
			}
			// The token honours it: it still signs long after any
			// genuine credential would have expired.
			if _, err := credClient(e, c, strings.TrimSpace).GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{}); err != nil {
				t.Errorf("the far-expiring credential does not sign: %v", err)
			}
		},
		FaultWhitespace: func(t *testing.T, e *Emulator, c *types.Credentials, _ time.Time) {
			for name, v := range map[string]string{
				"AccessKeyId":     aws.ToString(c.AccessKeyId),
				"SecretAccessKey": aws.ToString(c.SecretAccessKey),
				"SessionToken":    aws.ToString(c.SessionToken),
			} {
				if trimmed := strings.TrimSpace(v); trimmed == "" || trimmed == v || v != fieldPadding+trimmed+fieldPadding {
					t.Errorf("%s = %q, want it wrapped in %q", name, v, fieldPadding)
				}
			}
			// Sent as parsed, the credential does not sign; trimmed, it is
			// the genuine one underneath.
			if _, err := credClient(e, c, func(s string) string { return s }).GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{}); err == nil {
				t.Error("the padded credential signed a call as it is")
			}
			if _, err := credClient(e, c, strings.TrimSpace).GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{}); err != nil {
				t.Errorf("the trimmed credential does not sign: %v", err)
			}
		},
	}
	if got := CredentialShapes(); len(got) != len(checks) {
		t.Fatalf("CredentialShapes() = %v: a shape without a check here", got)
	}
	for _, shape := range CredentialShapes() {
		for _, ic := range issuingCalls {
			t.Run(string(shape)+"/"+ic.action, func(t *testing.T) {
				clock := newFakeClock()
				e := startEmulator(t, Config{Now: clock.Now})
				postFaults(t, e, fmt.Sprintf(`{"sequence":[{"fault":%q,"count":1}]}`, shape))
				client := rootClient(e)

				c, err := ic.call(client)
				if err != nil {
					t.Fatalf("%s under %s: %v, want a 200 the SDK parses", ic.action, shape, err)
				}
				checks[shape](t, e, c, clock.Now())
				if shape != FaultEmptyKey && shape != FaultWhitespace && !strings.HasPrefix(aws.ToString(c.AccessKeyId), "ASIA") {
					t.Errorf("AccessKeyId = %q, want an ASIA key: only one field is bent", aws.ToString(c.AccessKeyId))
				}
				if shape != FaultNoExpiration && c.Expiration == nil {
					t.Error("Expiration missing: only no_expiration drops it")
				}

				// The sequence had one step: the next call is whole.
				next, err := ic.call(client)
				if err != nil {
					t.Fatal(err)
				}
				checkCreds(t, next, aws.ToTime(next.Expiration))
				// The checks may sign GetCallerIdentity calls in between.
				calls := slices.DeleteFunc(e.Calls(), func(c Call) bool { return c.Action != ic.action })
				if len(calls) != 2 || calls[0].Outcome != string(shape) || calls[1].Outcome != "ok" {
					t.Fatalf("%s calls = %+v, want outcomes [%s ok]", ic.action, calls, shape)
				}
				// The log names the issued key bare, whatever the fault did
				// to it (empty_key issues none the client could use).
				if id := calls[0].IssuedKeyID; shape != FaultEmptyKey && (!strings.HasPrefix(id, "ASIA") || strings.TrimSpace(id) != id) {
					t.Errorf("IssuedKeyID = %q, want the bare ASIA key", id)
				}
			})
		}
	}
}

// credClient signs with the credential c, each part passed through fix.
func credClient(e *Emulator, c *types.Credentials, fix func(string) string) *sts.Client {
	return newClient(e, fix(aws.ToString(c.AccessKeyId)), fix(aws.ToString(c.SecretAccessKey)), fix(aws.ToString(c.SessionToken)))
}

// TestCredentialShapesPerRoleAndCall: a plan's match confines a shape to one
// role, and its sequence to a count of that role's calls; calls for other
// roles neither get it nor use it up, and calls that issue no credential
// answer normally.
func TestCredentialShapesPerRoleAndCall(t *testing.T) {
	e := startEmulator(t, Config{})
	plan := postFaults(t, e, `{"sequence":[{"fault":"empty_token","count":2},{"fault":"no_expiration","count":1}],"match":"role/app"}`)
	if want := []any{map[string]any{"fault": "empty_token", "count": 2.0}, map[string]any{"fault": "no_expiration", "count": 1.0}}; !slicesEqualJSON(plan["sequence"], want) {
		t.Fatalf("POST faults answered sequence %v, want %v", plan["sequence"], want)
	}
	client := rootClient(e)
	assume := func(role string) *types.Credentials {
		t.Helper()
		out, err := client.AssumeRole(ctx, assumeInput(role))
		if err != nil {
			t.Fatalf("AssumeRole %s: %v", role, err)
		}
		return out.Credentials
	}
	if c := assume("other"); aws.ToString(c.SessionToken) == "" || c.Expiration == nil {
		t.Fatal("a role the plan does not match got a bent credential")
	}
	if _, err := client.GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if c := assume("app"); aws.ToString(c.SessionToken) != "" {
			t.Fatalf("call %d for app: SessionToken present, want empty", i+1)
		}
	}
	if c := assume("app"); c.Expiration != nil || aws.ToString(c.SessionToken) == "" {
		t.Fatalf("third call for app: Expiration %v, token %d characters; want no expiration, a token",
			c.Expiration, len(aws.ToString(c.SessionToken)))
	}
	if c := assume("app"); aws.ToString(c.SessionToken) == "" || c.Expiration == nil {
		t.Fatal("after the sequence, app still gets a bent credential")
	}
	var outcomes []string
	for _, c := range e.Calls() {
		outcomes = append(outcomes, c.Action+":"+c.Outcome)
	}
	want := []string{"AssumeRole:ok", "GetCallerIdentity:ok", "AssumeRole:empty_token", "AssumeRole:empty_token", "AssumeRole:no_expiration", "AssumeRole:ok"}
	if !slices.Equal(outcomes, want) {
		t.Fatalf("calls %v, want %v", outcomes, want)
	}
}

// TestCredentialShapesOnCallsThatIssueNothing: a plan without match
// selects GetCallerIdentity too; the new shapes have nothing to bend there,
// so it answers normally (outcome ok) and uses up its step.
func TestCredentialShapesOnCallsThatIssueNothing(t *testing.T) {
	for _, shape := range []Fault{FaultEmptySecret, FaultEmptyToken, FaultNoExpiration, FaultFarExpiration, FaultWhitespace} {
		t.Run(string(shape), func(t *testing.T) {
			e := startEmulator(t, Config{})
			e.SetFaults(FaultPlan{Sequence: []FaultStep{{Fault: shape, Count: 1}}})
			out, err := rootClient(e).GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
			if err != nil || aws.ToString(out.UserId) == "" || strings.TrimSpace(aws.ToString(out.Arn)) != aws.ToString(out.Arn) {
				t.Fatalf("GetCallerIdentity under %s: %+v, %v; want a normal answer", shape, out, err)
			}
			if calls := e.Calls(); len(calls) != 1 || calls[0].Outcome != "ok" {
				t.Fatalf("calls = %+v, want one ok", calls)
			}
			if left := e.Faults().Sequence; len(left) != 0 {
				t.Fatalf("sequence left %v, want the step used up", left)
			}
		})
	}
}

// TestCredentialShapesParse: the command-line form and the control API
// both name the shapes, and an unknown name lists them.
func TestCredentialShapesParse(t *testing.T) {
	p, err := ParseFaultPlan("empty_secret:2,whitespace,no_expiration=0.5,far_expiration=0.25,empty_token=0.25,match=app")
	if err != nil {
		t.Fatal(err)
	}
	if want := []FaultStep{{FaultEmptySecret, 2}, {FaultWhitespace, 1}}; !slices.Equal(p.Sequence, want) || p.Match != "app" ||
		p.Probability[FaultNoExpiration] != 0.5 || p.Probability[FaultFarExpiration] != 0.25 || p.Probability[FaultEmptyToken] != 0.25 {
		t.Fatalf("parsed %+v", p)
	}
	_, err = ParseFaultPlan("no_token:1")
	for _, name := range []string{"empty_secret", "empty_token", "no_expiration", "far_expiration", "whitespace"} {
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("unknown fault error %v does not list %s", err, name)
		}
	}
}

func slicesEqualJSON(got any, want []any) bool {
	a, _ := json.Marshal(got)
	b, _ := json.Marshal(want)
	return string(a) == string(b)
}
