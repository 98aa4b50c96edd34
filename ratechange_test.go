package awsresilient

import (
	"testing"

	"github.com/hashicorp/vault/sdk/logical"
)

// TestRefresh_RaisingTheRateFreesAStarvedRole: at one STS call per 100 s a
// second role's cycle is refused every slot (RateLimited); once the
// operator raises sts_rate_limit, as the AWSResilientRateLimiterStarving
// runbook says, the next read of that role is served at once, not when the
// old rate would have drained the bucket, 100 s later.
func TestRefresh_RaisingTheRateFreesAStarvedRole(t *testing.T) {
	f := newFixture(t, fixtureOpts{refresh: map[string]interface{}{"sts_rate_limit": 0.01, "sts_burst": 1, "max_retries": 2, "retry_window": 2}})
	f.mustReadCreds(testRole) // takes the one slot
	mustDo(t, f.b, f.s, logical.CreateOperation, "roles/other", map[string]interface{}{"role_arn": "arn:aws:iam::123456789012:role/other"})
	resp, err := f.coldCycle("other")
	wantCoded(t, resp, err, 503, codeRateLimited)

	start := f.clock.Now()
	mustDo(t, f.b, f.s, logical.UpdateOperation, "config/refresh", map[string]interface{}{"sts_rate_limit": 10})
	resp, err = f.coldCycle("other")
	if err != nil || resp == nil || resp.IsError() {
		t.Fatalf("creds/other after raising sts_rate_limit to 10: %v %v", err, respErr(resp))
	}
	if waited := f.clock.Now().Sub(start); waited > f.b.settings.policy().block() {
		t.Fatalf("creds/other served %v after the rate was raised, want within its first block", waited)
	}
}
