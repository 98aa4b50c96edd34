package stsemu

import (
	"net/http"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sts"
)

// TestFederationTokenCannotAssumeRole: GetFederationToken credentials
// may call no STS action but GetCallerIdentity; AWS answers their
// AssumeRole with AccessDenied, even of a role that trusts anybody.
func TestFederationTokenCannotAssumeRole(t *testing.T) {
	e := startEmulator(t, hubAndSpokes())
	fed, err := rootClient(e).GetFederationToken(ctx, &sts.GetFederationTokenInput{Name: aws.String("fed")})
	if err != nil {
		t.Fatal(err)
	}
	client := credsClient(e, fed.Credentials)
	if _, err := client.GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{}); err != nil {
		t.Fatalf("GetCallerIdentity with a federation token: %v", err)
	}
	for _, role := range []string{roleARN("444444444444", "public"), roleARN(DefaultAccount, "x")} {
		_, err := assumeAs(client, role, "s1")
		if errorCode(err) != "AccessDenied" || httpStatus(err) != http.StatusForbidden ||
			!strings.Contains(errorMessage(err), ":federated-user/fed is not authorized to perform: sts:AssumeRole") {
			t.Fatalf("AssumeRole %s with a federation token: %v, want 403 AccessDenied naming the federated user", role, err)
		}
	}
}

// TestInjectedAccessDeniedNamesTheSigner: an AccessDenied fault names the
// principal whose credential signed the call: a role session's, not
// config/root's IAM user, when a hub's session signs.
func TestInjectedAccessDeniedNamesTheSigner(t *testing.T) {
	e := startEmulator(t, hubAndSpokes())
	hub := mustAssume(t, rootClient(e), roleARN(hubAccount, "hubs/hub"), "vault-hub")
	e.SetFaults(FaultPlan{Probability: map[Fault]float64{FaultAccessDenied: 1}, Match: "role/app"})
	_, err := assumeAs(credsClient(e, hub.Credentials), roleARN(spokeAccount, "app"), "s1")
	want := "User: arn:aws:sts::" + hubAccount + ":assumed-role/hub/vault-hub is not authorized to perform: sts:AssumeRole"
	if errorCode(err) != "AccessDenied" || !strings.Contains(errorMessage(err), want) {
		t.Fatalf("injected AccessDenied of a call signed by the hub's session: %v, want %q", err, want)
	}
	_, err = assumeAs(rootClient(e), roleARN(spokeAccount, "app"), "s2")
	if !strings.Contains(errorMessage(err), "User: "+rootUserArn+" ") {
		t.Fatalf("injected AccessDenied of a call signed by the IAM user: %v", err)
	}
}
