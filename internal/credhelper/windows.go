package credhelper

import (
	"fmt"
	"time"
)

// BotocoreAdvisoryWindow is botocore's refresh window, the widest of the
// AWS SDKs': boto3 and the awscli refresh process and container credentials
// with less than 15 minutes left (botocore.credentials'
// _DEFAULT_ADVISORY_REFRESH_TIMEOUT), keeping the one they have if that
// fails, and with less than 10 minutes left they wait for the refresh and
// fail the call when it fails (_DEFAULT_MANDATORY_REFRESH_TIMEOUT).
// aws-sdk-go-v2 refreshes container credentials 5 minutes before expiry
// (config's resolveHTTPCredProvider) and keeps process credentials until
// they expire (aws.CredentialsCache without an ExpiryWindow), so it runs the
// helper once per credential, whatever the credential's life.
//
// While the credential an SDK holds is inside its window, it asks on every
// credential access, that is before every AWS call: for credential_process,
// a run of this helper, a Vault read and, for a lease=true role, a new Vault
// lease each time.
const BotocoreAdvisoryWindow = 15 * time.Minute

// ProcessRunWarning is what credential-process says on stderr when the
// credential it prints has less than BotocoreAdvisoryWindow left at now:
// botocore will run the helper again before every AWS call until Vault
// serves a credential with more left. "" when there is nothing to say. The
// plugin serves a credential with at least 0.9 × refresh_fraction × its
// lifetime left while STS answers (the refresh starts between that and
// refresh_fraction × lifetime), so a role whose ttl makes that exceed 15
// minutes never gets here but in an STS outage.
func ProcessRunWarning(c Credential, now time.Time) string {
	left := c.Expiration.Sub(now)
	if left >= BotocoreAdvisoryWindow {
		return ""
	}
	cost := "a Vault read"
	if c.Leased {
		cost = "a Vault read and a new Vault lease (a role read by this helper wants lease=false)"
	}
	return fmt.Sprintf("warning: credential %s has %s left, less than botocore's %s refresh window: boto3 and the awscli run this helper again before every AWS call until Vault serves one with more left, each run %s; "+
		"give the role a ttl with 0.9 × ttl × refresh_fraction above 15m (the default 1h with refresh_fraction 0.33 is), "+
		"or run `aws-resilient-credentials serve` for a long-running service (if STS is failing, the role's status/ path says why)",
		c.AccessKeyID, left.Truncate(time.Second), BotocoreAdvisoryWindow, cost)
}
