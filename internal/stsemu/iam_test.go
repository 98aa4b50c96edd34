package stsemu

import (
	"errors"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/iam"
	iamtypes "github.com/aws/aws-sdk-go-v2/service/iam/types"
	"github.com/aws/aws-sdk-go-v2/service/sts"
)

// newIAMClient is the real aws-sdk-go-v2 IAM client pointed at e, signing
// for us-east-1 as IAM requires, with SDK retries off.
func newIAMClient(e *Emulator, akid, secret, token string) *iam.Client {
	return iam.New(iam.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(e.URL()),
		Credentials:  credentials.NewStaticCredentialsProvider(akid, secret, token),
		Retryer:      aws.NopRetryer{},
	})
}

// rootIAM signs with the emulator's default root key pair.
func rootIAM(e *Emulator) *iam.Client {
	return newIAMClient(e, DefaultAccessKey, DefaultSecretKey, "")
}

// createKey makes a key for the root user and returns its id and secret.
func createKey(t *testing.T, e *Emulator) (id, secret string) {
	t.Helper()
	out, err := rootIAM(e).CreateAccessKey(ctx, &iam.CreateAccessKeyInput{})
	if err != nil {
		t.Fatalf("CreateAccessKey: %v", err)
	}
	return aws.ToString(out.AccessKey.AccessKeyId), aws.ToString(out.AccessKey.SecretAccessKey)
}

// keyStatuses lists the root user's keys as "ID=Status" through the SDK.
func keyStatuses(t *testing.T, e *Emulator) []string {
	t.Helper()
	out, err := rootIAM(e).ListAccessKeys(ctx, &iam.ListAccessKeysInput{})
	if err != nil {
		t.Fatalf("ListAccessKeys: %v", err)
	}
	var got []string
	for _, m := range out.AccessKeyMetadata {
		got = append(got, aws.ToString(m.AccessKeyId)+"="+string(m.Status))
	}
	return got
}

// wantRejected asserts that both STS and IAM refuse a key as AWS refuses a
// deleted, inactive or not yet propagated one.
func wantRejected(t *testing.T, e *Emulator, id, secret string) {
	t.Helper()
	_, err := newClient(e, id, secret, "").GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
	if code, status := errorCode(err), httpStatus(err); code != "InvalidClientTokenId" || status != 403 {
		t.Errorf("STS GetCallerIdentity: %q/%d (%v), want InvalidClientTokenId/403", code, status, err)
	} else if !strings.Contains(err.Error(), "The security token included in the request is invalid.") {
		t.Errorf("STS message %q, want AWS's", err)
	}
	_, err = newIAMClient(e, id, secret, "").GetUser(ctx, &iam.GetUserInput{})
	if code, status := errorCode(err), httpStatus(err); code != "InvalidClientTokenId" || status != 403 {
		t.Errorf("IAM GetUser: %q/%d (%v), want InvalidClientTokenId/403", code, status, err)
	}
}

// wantAccepted asserts that both STS and IAM accept a key of the root user.
func wantAccepted(t *testing.T, e *Emulator, id, secret string) {
	t.Helper()
	out, err := newClient(e, id, secret, "").GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
	if err != nil {
		t.Errorf("STS GetCallerIdentity: %v", err)
	} else if got, want := aws.ToString(out.Arn), "arn:aws:iam::123456789012:user/sts-emulator"; got != want {
		t.Errorf("Arn = %q, want %q", got, want)
	}
	if _, err := newIAMClient(e, id, secret, "").GetUser(ctx, &iam.GetUserInput{}); err != nil {
		t.Errorf("IAM GetUser: %v", err)
	}
}

var akiaRE = regexp.MustCompile(`^AKIA[A-Z2-7]{16}$`)

func TestIAMActionsWithSDK(t *testing.T) {
	clock := newFakeClock()
	e := startEmulator(t, Config{Now: clock.Now})
	root := rootIAM(e)
	started := clock.Now().UTC().Truncate(time.Second)

	t.Run("GetUser is the caller's own user", func(t *testing.T) {
		out, err := root.GetUser(ctx, &iam.GetUserInput{})
		if err != nil {
			t.Fatal(err)
		}
		id, err := rootClient(e).GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
		if err != nil {
			t.Fatal(err)
		}
		u := out.User
		if aws.ToString(u.UserName) != "sts-emulator" || aws.ToString(u.Path) != "/" ||
			aws.ToString(u.Arn) != aws.ToString(id.Arn) || aws.ToString(u.UserId) != aws.ToString(id.UserId) ||
			!strings.HasPrefix(aws.ToString(u.UserId), "AIDA") || !aws.ToTime(u.CreateDate).Equal(started) {
			t.Errorf("User = %+v; want sts-emulator at / with GetCallerIdentity's Arn %s and UserId %s, created %v",
				u, aws.ToString(id.Arn), aws.ToString(id.UserId), started)
		}
		named, err := root.GetUser(ctx, &iam.GetUserInput{UserName: aws.String("STS-Emulator")})
		if err != nil || aws.ToString(named.User.UserName) != "sts-emulator" {
			t.Errorf("GetUser by name in another case: %v, %v; IAM user names are case-insensitive", named, err)
		}
	})

	t.Run("ListAccessKeys starts with the configured pair", func(t *testing.T) {
		out, err := root.ListAccessKeys(ctx, &iam.ListAccessKeysInput{})
		if err != nil {
			t.Fatal(err)
		}
		if len(out.AccessKeyMetadata) != 1 || out.IsTruncated {
			t.Fatalf("got %+v, want one key, not truncated", out)
		}
		m := out.AccessKeyMetadata[0]
		if aws.ToString(m.AccessKeyId) != DefaultAccessKey || m.Status != iamtypes.StatusTypeActive ||
			aws.ToString(m.UserName) != "sts-emulator" || !aws.ToTime(m.CreateDate).Equal(started) {
			t.Errorf("key = %+v", m)
		}
	})

	var newID, newSecret string
	t.Run("CreateAccessKey", func(t *testing.T) {
		clock.Advance(3 * time.Second)
		out, err := root.CreateAccessKey(ctx, &iam.CreateAccessKeyInput{})
		if err != nil {
			t.Fatal(err)
		}
		k := out.AccessKey
		newID, newSecret = aws.ToString(k.AccessKeyId), aws.ToString(k.SecretAccessKey)
		if !akiaRE.MatchString(newID) || len(newSecret) != 40 || k.Status != iamtypes.StatusTypeActive ||
			aws.ToString(k.UserName) != "sts-emulator" || !aws.ToTime(k.CreateDate).Equal(clock.Now().UTC().Truncate(time.Second)) {
			t.Errorf("AccessKey = id %q, %d-char secret, status %s, user %q, created %v", newID, len(newSecret), k.Status,
				aws.ToString(k.UserName), aws.ToTime(k.CreateDate))
		}
		if got := keyStatuses(t, e); len(got) != 2 || got[1] != newID+"=Active" {
			t.Errorf("keys = %v, want the root key then %s=Active", got, newID)
		}
	})

	t.Run("the new key signs STS and IAM calls", func(t *testing.T) {
		wantAccepted(t, e, newID, newSecret)
		out, err := newIAMClient(e, newID, newSecret, "").ListAccessKeys(ctx, &iam.ListAccessKeysInput{})
		if err != nil || len(out.AccessKeyMetadata) != 2 {
			t.Errorf("ListAccessKeys with the new key: %v, %v; want the same user's two keys", out, err)
		}
	})

	t.Run("UpdateAccessKey Inactive then Active", func(t *testing.T) {
		if _, err := root.UpdateAccessKey(ctx, &iam.UpdateAccessKeyInput{AccessKeyId: aws.String(newID), Status: iamtypes.StatusTypeInactive}); err != nil {
			t.Fatal(err)
		}
		if got := keyStatuses(t, e); got[1] != newID+"=Inactive" {
			t.Errorf("keys = %v, want %s=Inactive", got, newID)
		}
		wantRejected(t, e, newID, newSecret)
		if _, err := root.UpdateAccessKey(ctx, &iam.UpdateAccessKeyInput{AccessKeyId: aws.String(newID), Status: iamtypes.StatusTypeActive}); err != nil {
			t.Fatal(err)
		}
		wantAccepted(t, e, newID, newSecret)
	})

	t.Run("a key can deactivate itself", func(t *testing.T) {
		self := newIAMClient(e, newID, newSecret, "")
		if _, err := self.UpdateAccessKey(ctx, &iam.UpdateAccessKeyInput{AccessKeyId: aws.String(newID), Status: iamtypes.StatusTypeInactive}); err != nil {
			t.Fatal(err)
		}
		wantRejected(t, e, newID, newSecret)
		if _, err := root.UpdateAccessKey(ctx, &iam.UpdateAccessKeyInput{AccessKeyId: aws.String(newID), Status: iamtypes.StatusTypeActive}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("the new key deletes the old one, which is then refused", func(t *testing.T) {
		client := newIAMClient(e, newID, newSecret, "")
		if _, err := client.DeleteAccessKey(ctx, &iam.DeleteAccessKeyInput{AccessKeyId: aws.String(DefaultAccessKey)}); err != nil {
			t.Fatal(err)
		}
		wantRejected(t, e, DefaultAccessKey, DefaultSecretKey)
		wantAccepted(t, e, newID, newSecret)
		if got := keyStatuses2(t, client); len(got) != 1 || got[0] != newID+"=Active" {
			t.Errorf("keys = %v, want only %s", got, newID)
		}
	})

	t.Run("stats count IAM calls by action", func(t *testing.T) {
		s := e.Stats()
		if s.Count("CreateAccessKey", "ok") != 1 || s.Count("DeleteAccessKey", "ok") != 1 || s.Count("UpdateAccessKey", "ok") != 4 ||
			s.Count("GetUser", "InvalidClientTokenId") != 3 || s.Count("ListAccessKeys", "") == 0 {
			t.Errorf("stats by action = %v", s.ByAction)
		}
	})
}

// keyStatuses2 is keyStatuses with a given client (the root key may be gone).
func keyStatuses2(t *testing.T, c *iam.Client) []string {
	t.Helper()
	out, err := c.ListAccessKeys(ctx, &iam.ListAccessKeysInput{})
	if err != nil {
		t.Fatalf("ListAccessKeys: %v", err)
	}
	var got []string
	for _, m := range out.AccessKeyMetadata {
		got = append(got, aws.ToString(m.AccessKeyId)+"="+string(m.Status))
	}
	return got
}

func TestIAMAccessKeyQuota(t *testing.T) {
	e := startEmulator(t, Config{})
	id, _ := createKey(t, e)
	// An inactive key still holds its slot, as in IAM.
	if _, err := rootIAM(e).UpdateAccessKey(ctx, &iam.UpdateAccessKeyInput{AccessKeyId: aws.String(id), Status: iamtypes.StatusTypeInactive}); err != nil {
		t.Fatal(err)
	}
	_, err := rootIAM(e).CreateAccessKey(ctx, &iam.CreateAccessKeyInput{})
	if code, status := errorCode(err), httpStatus(err); code != "LimitExceeded" || status != 409 {
		t.Fatalf("third key: %q/%d (%v), want LimitExceeded/409", code, status, err)
	}
	if !strings.Contains(err.Error(), "Cannot exceed quota for AccessKeysPerUser: 2") {
		t.Errorf("message %q, want AWS's quota wording", err)
	}
	var le *iamtypes.LimitExceededException
	if !errors.As(err, &le) {
		t.Errorf("the SDK did not map the error to its LimitExceededException: %T", err)
	}
	if n := len(keyStatuses(t, e)); n != 2 {
		t.Errorf("%d keys after the refused create, want 2", n)
	}
	if _, err := rootIAM(e).DeleteAccessKey(ctx, &iam.DeleteAccessKeyInput{AccessKeyId: aws.String(id)}); err != nil {
		t.Fatal(err)
	}
	createKey(t, e) // a freed slot can be used again
}

// TestIAMQuotaUnderConcurrency races many CreateAccessKey calls: exactly one
// of the free slots' worth may succeed.
func TestIAMQuotaUnderConcurrency(t *testing.T) {
	e := startEmulator(t, Config{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[string]int{}
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := rootIAM(e).CreateAccessKey(ctx, &iam.CreateAccessKeyInput{})
			mu.Lock()
			defer mu.Unlock()
			codes[errorCode(err)]++
		}()
	}
	wg.Wait()
	if codes[""] != 1 || codes["LimitExceeded"] != 19 {
		t.Errorf("outcomes %v, want 1 success and 19 LimitExceeded", codes)
	}
}

func TestIAMNoSuchEntity(t *testing.T) {
	e := startEmulator(t, Config{})
	root := rootIAM(e)
	const missing = "AKIAMISSINGMISSING00"
	tests := []struct {
		name    string
		call    func() error
		message string
	}{
		{"DeleteAccessKey of a missing key", func() error {
			_, err := root.DeleteAccessKey(ctx, &iam.DeleteAccessKeyInput{AccessKeyId: aws.String(missing)})
			return err
		}, "The Access Key with id " + missing + " cannot be found."},
		{"UpdateAccessKey of a missing key", func() error {
			_, err := root.UpdateAccessKey(ctx, &iam.UpdateAccessKeyInput{AccessKeyId: aws.String(missing), Status: iamtypes.StatusTypeInactive})
			return err
		}, "The Access Key with id " + missing + " cannot be found."},
		{"GetUser of an unknown user", func() error {
			_, err := root.GetUser(ctx, &iam.GetUserInput{UserName: aws.String("nobody")})
			return err
		}, "The user with name nobody cannot be found."},
		{"ListAccessKeys of an unknown user", func() error {
			_, err := root.ListAccessKeys(ctx, &iam.ListAccessKeysInput{UserName: aws.String("nobody")})
			return err
		}, "The user with name nobody cannot be found."},
		{"CreateAccessKey for an unknown user", func() error {
			_, err := root.CreateAccessKey(ctx, &iam.CreateAccessKeyInput{UserName: aws.String("nobody")})
			return err
		}, "The user with name nobody cannot be found."},
		{"DeleteAccessKey naming another user than the key's", func() error {
			_, err := root.DeleteAccessKey(ctx, &iam.DeleteAccessKeyInput{AccessKeyId: aws.String(DefaultAccessKey), UserName: aws.String("nobody")})
			return err
		}, "The user with name nobody cannot be found."},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if code, status := errorCode(err), httpStatus(err); code != "NoSuchEntity" || status != 404 {
				t.Fatalf("%q/%d (%v), want NoSuchEntity/404", code, status, err)
			}
			var nse *iamtypes.NoSuchEntityException
			if !errors.As(err, &nse) || aws.ToString(nse.Message) != tc.message {
				t.Errorf("error %v, want NoSuchEntityException %q", err, tc.message)
			}
		})
	}

	t.Run("deleting twice", func(t *testing.T) {
		id, _ := createKey(t, e)
		if _, err := root.DeleteAccessKey(ctx, &iam.DeleteAccessKeyInput{AccessKeyId: aws.String(id)}); err != nil {
			t.Fatal(err)
		}
		_, err := root.DeleteAccessKey(ctx, &iam.DeleteAccessKeyInput{AccessKeyId: aws.String(id)})
		if code := errorCode(err); code != "NoSuchEntity" {
			t.Errorf("second delete: %q (%v), want NoSuchEntity", code, err)
		}
	})
}

func TestIAMValidation(t *testing.T) {
	e := startEmulator(t, Config{})
	root := rootIAM(e)
	tests := []struct {
		name    string
		call    func() error
		message string
	}{
		{"bad UserName", func() error {
			_, err := root.GetUser(ctx, &iam.GetUserInput{UserName: aws.String("has space")})
			return err
		}, "Value 'has space' at 'userName' failed to satisfy constraint: Member must satisfy regular expression pattern"},
		{"short AccessKeyId", func() error {
			_, err := root.DeleteAccessKey(ctx, &iam.DeleteAccessKeyInput{AccessKeyId: aws.String("AKIA")})
			return err
		}, "Member must have length greater than or equal to 16"},
		{"bad Status", func() error {
			_, err := root.UpdateAccessKey(ctx, &iam.UpdateAccessKeyInput{AccessKeyId: aws.String(DefaultAccessKey), Status: "Paused"})
			return err
		}, "Member must satisfy enum value set: [Active, Inactive, Expired]"},
		{"Expired Status", func() error {
			_, err := root.UpdateAccessKey(ctx, &iam.UpdateAccessKeyInput{AccessKeyId: aws.String(DefaultAccessKey), Status: iamtypes.StatusTypeExpired})
			return err
		}, "not Expired"},
		{"MaxItems 0", func() error {
			_, err := root.ListAccessKeys(ctx, &iam.ListAccessKeysInput{MaxItems: aws.Int32(0)})
			return err
		}, "Member must have value greater than or equal to 1"},
		{"stale Marker", func() error {
			_, err := root.ListAccessKeys(ctx, &iam.ListAccessKeysInput{Marker: aws.String("AKIAGONEGONEGONEGONE")})
			return err
		}, "Invalid Marker"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if code, status := errorCode(err), httpStatus(err); code != "ValidationError" || status != 400 {
				t.Fatalf("%q/%d (%v), want ValidationError/400", code, status, err)
			}
			if !strings.Contains(err.Error(), tc.message) {
				t.Errorf("error %q lacks %q", err, tc.message)
			}
		})
	}
	if got := keyStatuses(t, e); len(got) != 1 || got[0] != DefaultAccessKey+"=Active" {
		t.Errorf("keys after refused calls = %v, want the root key untouched", got)
	}
}

func TestIAMListAccessKeysPages(t *testing.T) {
	e := startEmulator(t, Config{})
	id, _ := createKey(t, e)
	first, err := rootIAM(e).ListAccessKeys(ctx, &iam.ListAccessKeysInput{MaxItems: aws.Int32(1)})
	if err != nil {
		t.Fatal(err)
	}
	if len(first.AccessKeyMetadata) != 1 || !first.IsTruncated || aws.ToString(first.Marker) == "" ||
		aws.ToString(first.AccessKeyMetadata[0].AccessKeyId) != DefaultAccessKey {
		t.Fatalf("first page %+v, want the root key, truncated, with a marker", first)
	}
	second, err := rootIAM(e).ListAccessKeys(ctx, &iam.ListAccessKeysInput{MaxItems: aws.Int32(1), Marker: first.Marker})
	if err != nil {
		t.Fatal(err)
	}
	if len(second.AccessKeyMetadata) != 1 || second.IsTruncated || aws.ToString(second.AccessKeyMetadata[0].AccessKeyId) != id {
		t.Errorf("second page %+v, want %s and the end", second, id)
	}
	// The SDK's paginator walks the same pages.
	var all []string
	p := iam.NewListAccessKeysPaginator(rootIAM(e), &iam.ListAccessKeysInput{MaxItems: aws.Int32(1)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range page.AccessKeyMetadata {
			all = append(all, aws.ToString(m.AccessKeyId))
		}
	}
	if len(all) != 2 || all[0] != DefaultAccessKey || all[1] != id {
		t.Errorf("paginator saw %v", all)
	}
}

// TestIAMPropagation checks the delay before a new key authenticates,
// exactly, on the fake clock.
func TestIAMPropagation(t *testing.T) {
	clock := newFakeClock()
	e := startEmulator(t, Config{Now: clock.Now, IAMPropagation: 10 * time.Second})
	id, secret := createKey(t, e)

	// IAM's control plane lists the key at once; only signing waits.
	if got := keyStatuses(t, e); len(got) != 2 || got[1] != id+"=Active" {
		t.Errorf("keys right after create = %v", got)
	}
	usable := func() bool {
		for _, k := range e.IAMUsers()[0].AccessKeys {
			if k.AccessKeyID == id {
				return k.Usable
			}
		}
		t.Fatalf("key %s not in IAMUsers", id)
		return false
	}
	wantRejected(t, e, id, secret)
	if usable() {
		t.Error("IAMUsers says usable before the propagation delay")
	}
	clock.Advance(10*time.Second - time.Nanosecond)
	wantRejected(t, e, id, secret)
	clock.Advance(time.Nanosecond)
	wantAccepted(t, e, id, secret)
	if !usable() {
		t.Error("IAMUsers says not usable after the propagation delay")
	}

	t.Run("runtime change applies to keys created afterwards", func(t *testing.T) {
		if _, err := rootIAM(e).DeleteAccessKey(ctx, &iam.DeleteAccessKeyInput{AccessKeyId: aws.String(id)}); err != nil {
			t.Fatal(err)
		}
		e.SetIAMPropagation(0)
		id, secret := createKey(t, e)
		wantAccepted(t, e, id, secret)
		if _, err := rootIAM(e).DeleteAccessKey(ctx, &iam.DeleteAccessKeyInput{AccessKeyId: aws.String(id)}); err != nil {
			t.Fatal(err)
		}
		e.SetIAMPropagation(2 * time.Second)
		id, secret = createKey(t, e)
		e.SetIAMPropagation(0) // too late for this key
		wantRejected(t, e, id, secret)
		clock.Advance(2 * time.Second)
		wantAccepted(t, e, id, secret)
	})
}

func TestIAMWithTemporaryCredentials(t *testing.T) {
	e := startEmulator(t, Config{})
	sess := func(t *testing.T, in *sts.GetSessionTokenInput) *iam.Client {
		out, err := rootClient(e).GetSessionToken(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		c := out.Credentials
		return newIAMClient(e, aws.ToString(c.AccessKeyId), aws.ToString(c.SecretAccessKey), aws.ToString(c.SessionToken))
	}

	t.Run("role session must name the user", func(t *testing.T) {
		out, err := rootClient(e).AssumeRole(ctx, assumeInput("rotator"))
		if err != nil {
			t.Fatal(err)
		}
		c := out.Credentials
		client := newIAMClient(e, aws.ToString(c.AccessKeyId), aws.ToString(c.SecretAccessKey), aws.ToString(c.SessionToken))
		_, err = client.GetUser(ctx, &iam.GetUserInput{})
		if code := errorCode(err); code != "ValidationError" || !strings.Contains(err.Error(), "Must specify userName when calling with non-User credentials") {
			t.Errorf("GetUser without UserName: %v, want AWS's ValidationError", err)
		}
		u, err := client.GetUser(ctx, &iam.GetUserInput{UserName: aws.String("sts-emulator")})
		if err != nil || aws.ToString(u.User.UserName) != "sts-emulator" {
			t.Errorf("GetUser with UserName: %v, %v", u, err)
		}
	})

	t.Run("session token without MFA is refused by IAM", func(t *testing.T) {
		_, err := sess(t, &sts.GetSessionTokenInput{}).GetUser(ctx, &iam.GetUserInput{})
		if code := errorCode(err); code != "InvalidClientTokenId" {
			t.Errorf("got %q (%v), want InvalidClientTokenId as AWS answers", code, err)
		}
	})

	t.Run("session token with MFA acts as the user", func(t *testing.T) {
		client := sess(t, &sts.GetSessionTokenInput{SerialNumber: aws.String("arn:aws:iam::123456789012:mfa/dev"), TokenCode: aws.String("123456")})
		u, err := client.GetUser(ctx, &iam.GetUserInput{})
		if err != nil || aws.ToString(u.User.UserName) != "sts-emulator" {
			t.Errorf("GetUser: %v, %v", u, err)
		}
	})

	t.Run("federation token is refused by IAM", func(t *testing.T) {
		out, err := rootClient(e).GetFederationToken(ctx, &sts.GetFederationTokenInput{Name: aws.String("fed")})
		if err != nil {
			t.Fatal(err)
		}
		c := out.Credentials
		_, err = newIAMClient(e, aws.ToString(c.AccessKeyId), aws.ToString(c.SecretAccessKey), aws.ToString(c.SessionToken)).
			ListAccessKeys(ctx, &iam.ListAccessKeysInput{UserName: aws.String("sts-emulator")})
		if code := errorCode(err); code != "InvalidClientTokenId" {
			t.Errorf("got %q (%v), want InvalidClientTokenId", code, err)
		}
	})

	t.Run("credentials issued with a key outlive its deletion", func(t *testing.T) {
		id, secret := createKey(t, e)
		out, err := newClient(e, id, secret, "").AssumeRole(ctx, assumeInput("app"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rootIAM(e).DeleteAccessKey(ctx, &iam.DeleteAccessKeyInput{AccessKeyId: aws.String(id)}); err != nil {
			t.Fatal(err)
		}
		c := out.Credentials
		if _, err := newClient(e, aws.ToString(c.AccessKeyId), aws.ToString(c.SecretAccessKey), aws.ToString(c.SessionToken)).
			GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{}); err != nil {
			t.Errorf("role credentials after the issuing key was deleted: %v", err)
		}
	})
}

// TestIAMUserConfig checks a configured user name and that a rotated key of
// it is accepted for every STS action that a long-term key may call.
func TestIAMUserConfig(t *testing.T) {
	e := startEmulator(t, Config{IAMUser: "vault-root", AccessKey: "AKIAVAULTROOT0000001", SecretKey: "vault-root-secret"})
	root := newIAMClient(e, "AKIAVAULTROOT0000001", "vault-root-secret", "")
	u, err := root.GetUser(ctx, &iam.GetUserInput{})
	if err != nil || aws.ToString(u.User.Arn) != "arn:aws:iam::123456789012:user/vault-root" {
		t.Fatalf("GetUser: %v, %v", u, err)
	}
	out, err := root.CreateAccessKey(ctx, &iam.CreateAccessKeyInput{UserName: aws.String("vault-root")})
	if err != nil {
		t.Fatal(err)
	}
	client := newClient(e, aws.ToString(out.AccessKey.AccessKeyId), aws.ToString(out.AccessKey.SecretAccessKey), "")
	id, err := client.GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
	if err != nil || aws.ToString(id.Arn) != "arn:aws:iam::123456789012:user/vault-root" || aws.ToString(id.UserId) != aws.ToString(u.User.UserId) {
		t.Errorf("GetCallerIdentity with the new key: %v, %v; want the same user", id, err)
	}
	if _, err := client.AssumeRole(ctx, assumeInput("app")); err != nil {
		t.Errorf("AssumeRole with the new key: %v", err)
	}
	if _, err := client.GetSessionToken(ctx, &sts.GetSessionTokenInput{}); err != nil {
		t.Errorf("GetSessionToken with the new key: %v", err)
	}
	if _, err := client.GetFederationToken(ctx, &sts.GetFederationTokenInput{Name: aws.String("fed")}); err != nil {
		t.Errorf("GetFederationToken with the new key: %v", err)
	}
}

// TestIAMThrottlingIsSeparate: the token bucket is STS's; IAM calls neither
// use it nor are refused by it.
func TestIAMThrottlingIsSeparate(t *testing.T) {
	clock := newFakeClock()
	e := startEmulator(t, Config{Now: clock.Now, Rate: 1, Burst: 1})
	for i := range 5 {
		if _, err := rootIAM(e).GetUser(ctx, &iam.GetUserInput{}); err != nil {
			t.Fatalf("IAM call %d: %v", i, err)
		}
	}
	if _, err := rootClient(e).GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{}); err != nil {
		t.Errorf("STS call after IAM calls: %v; they must not have drained the bucket", err)
	}
	if _, err := rootClient(e).GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{}); errorCode(err) != "Throttling" {
		t.Errorf("second STS call: %v, want Throttling", err)
	}
}

// TestConfiguredKeyIgnoresClock: the configured pair is usable whatever the
// clock says, even before the emulator's creation, as it was before IAM.
func TestConfiguredKeyIgnoresClock(t *testing.T) {
	clock := newFakeClock()
	clock.Advance(10 * time.Minute)
	e := startEmulator(t, Config{Now: clock.Now, SigningNow: time.Now, IAMPropagation: time.Hour})
	clock.Advance(-20 * time.Minute)
	wantAccepted(t, e, DefaultAccessKey, DefaultSecretKey)
	if k := e.IAMUsers()[0].AccessKeys[0]; !k.Usable || k.UsableAt.IsZero() {
		t.Errorf("configured key = %+v, want usable with a usable_at", k)
	}
}
