package stsemu

// The IAM half of external_test.go: the awscli and botocore drive the IAM
// API through a key rotation, checking the XML shapes, the error documents
// and the SigV4 scope (service iam, region us-east-1) against a second
// implementation of each.

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/testtool"
)

func TestAWSCLIIAM(t *testing.T) {
	bin := testtool.Require(t, "aws", "--version")
	e := startEmulator(t, Config{})
	run := func(t *testing.T, akid, secret string, args ...string) string {
		t.Helper()
		out, stderr, err := awsCLI(t, bin, e, akid, secret, "", args...)
		if err != nil {
			t.Fatalf("aws %s: %v\n%s", strings.Join(args, " "), err, stderr)
		}
		return out
	}
	fails := func(t *testing.T, want, akid, secret string, args ...string) {
		t.Helper()
		_, stderr, err := awsCLI(t, bin, e, akid, secret, "", args...)
		if err == nil || !strings.Contains(stderr, want) {
			t.Errorf("aws %s: err %v, stderr %q; want a failure with %q", strings.Join(args, " "), err, stderr, want)
		}
	}

	var user struct {
		User struct {
			UserName, UserID, Arn, Path, CreateDate string
		}
	}
	if err := json.Unmarshal([]byte(run(t, DefaultAccessKey, DefaultSecretKey, "iam", "get-user")), &user); err != nil {
		t.Fatal(err)
	}
	if u := user.User; u.UserName != "sts-emulator" || u.Arn != "arn:aws:iam::123456789012:user/sts-emulator" || u.Path != "/" {
		t.Errorf("get-user = %+v", u)
	} else if _, err := time.Parse(time.RFC3339, u.CreateDate); err != nil {
		t.Errorf("CreateDate %q: %v", u.CreateDate, err)
	}

	type keyList struct {
		AccessKeyMetadata []struct{ UserName, AccessKeyID, Status, CreateDate string }
		IsTruncated       bool
	}
	ids := func(l keyList) []string {
		var out []string
		for _, k := range l.AccessKeyMetadata {
			out = append(out, k.AccessKeyID+"="+k.Status)
		}
		return out
	}
	var before keyList
	if err := json.Unmarshal([]byte(run(t, DefaultAccessKey, DefaultSecretKey, "iam", "list-access-keys")), &before); err != nil {
		t.Fatal(err)
	}
	if got := ids(before); !reflect.DeepEqual(got, []string{DefaultAccessKey + "=Active"}) || before.AccessKeyMetadata[0].UserName != "sts-emulator" {
		t.Errorf("list-access-keys = %+v", before)
	}

	var created struct {
		AccessKey struct{ UserName, AccessKeyID, Status, SecretAccessKey, CreateDate string }
	}
	if err := json.Unmarshal([]byte(run(t, DefaultAccessKey, DefaultSecretKey, "iam", "create-access-key")), &created); err != nil {
		t.Fatal(err)
	}
	k := created.AccessKey
	if !akiaRE.MatchString(k.AccessKeyID) || len(k.SecretAccessKey) != 40 || k.Status != "Active" || k.UserName != "sts-emulator" {
		t.Fatalf("create-access-key: id %q, %d-char secret, status %q, user %q", k.AccessKeyID, len(k.SecretAccessKey), k.Status, k.UserName)
	}

	t.Run("the new key works for sts and iam", func(t *testing.T) {
		var id struct{ Arn string }
		if err := json.Unmarshal([]byte(run(t, k.AccessKeyID, k.SecretAccessKey, "sts", "get-caller-identity")), &id); err != nil {
			t.Fatal(err)
		}
		if id.Arn != "arn:aws:iam::123456789012:user/sts-emulator" {
			t.Errorf("get-caller-identity Arn %q", id.Arn)
		}
		var l keyList
		if err := json.Unmarshal([]byte(run(t, k.AccessKeyID, k.SecretAccessKey, "iam", "list-access-keys")), &l); err != nil {
			t.Fatal(err)
		}
		if got := ids(l); !reflect.DeepEqual(got, []string{DefaultAccessKey + "=Active", k.AccessKeyID + "=Active"}) {
			t.Errorf("list-access-keys = %v", got)
		}
	})

	t.Run("a third key is over the quota", func(t *testing.T) {
		fails(t, "LimitExceeded", DefaultAccessKey, DefaultSecretKey, "iam", "create-access-key")
	})

	t.Run("an inactive key is refused", func(t *testing.T) {
		run(t, DefaultAccessKey, DefaultSecretKey, "iam", "update-access-key", "--access-key-id", k.AccessKeyID, "--status", "Inactive")
		fails(t, "InvalidClientTokenId", k.AccessKeyID, k.SecretAccessKey, "sts", "get-caller-identity")
		fails(t, "InvalidClientTokenId", k.AccessKeyID, k.SecretAccessKey, "iam", "get-user")
		run(t, DefaultAccessKey, DefaultSecretKey, "iam", "update-access-key", "--access-key-id", k.AccessKeyID, "--status", "Active")
	})

	t.Run("the new key deletes the old one", func(t *testing.T) {
		run(t, k.AccessKeyID, k.SecretAccessKey, "iam", "delete-access-key", "--access-key-id", DefaultAccessKey)
		fails(t, "InvalidClientTokenId", DefaultAccessKey, DefaultSecretKey, "sts", "get-caller-identity")
		fails(t, "NoSuchEntity", k.AccessKeyID, k.SecretAccessKey, "iam", "delete-access-key", "--access-key-id", DefaultAccessKey)
	})

	s := e.Stats()
	want := map[string]map[string]int{
		"GetUser":           {"ok": 1, "InvalidClientTokenId": 1},
		"ListAccessKeys":    {"ok": 2},
		"CreateAccessKey":   {"ok": 1, "LimitExceeded": 1},
		"UpdateAccessKey":   {"ok": 2},
		"DeleteAccessKey":   {"ok": 1, "NoSuchEntity": 1},
		"GetCallerIdentity": {"ok": 1, "InvalidClientTokenId": 2},
	}
	if !reflect.DeepEqual(s.ByAction, want) {
		t.Errorf("emulator saw %v\nwant %v (one request per aws invocation, no hidden retries)", s.ByAction, want)
	}
}

func TestBotocoreIAM(t *testing.T) {
	py := testtool.Require(t, "python3", "-c", "import botocore")
	e := startEmulator(t, Config{})
	cmd := exec.Command(py, "testdata/botocore_iam_client.py", e.URL(), DefaultAccessKey, DefaultSecretKey)
	cmd.Env = testtool.Env([]string{"AWS_"}, "AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null", "AWS_EC2_METADATA_DISABLED=true")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("botocore_iam_client.py: %v\n%s", err, stderr.String())
	}
	type apiErr struct {
		Code    string `json:"code"`
		Status  int    `json:"status"`
		Message string `json:"message"`
	}
	var got struct {
		User struct {
			Name    string `json:"name"`
			Arn     string `json:"arn"`
			ID      string `json:"id"`
			Path    string `json:"path"`
			Created string `json:"created"`
		} `json:"user"`
		KeysBefore [][]string `json:"keys_before"`
		Truncated  bool       `json:"truncated"`
		Created    struct {
			ID        string `json:"id"`
			SecretLen int    `json:"secret_len"`
			Status    string `json:"status"`
			User      string `json:"user"`
			Created   string `json:"created"`
		} `json:"created"`
		Quota            *apiErr    `json:"quota"`
		CallerWithNewKey string     `json:"caller_with_new_key"`
		InactiveSTS      *apiErr    `json:"inactive_sts"`
		InactiveIAM      *apiErr    `json:"inactive_iam"`
		OldKeySTS        *apiErr    `json:"old_key_sts"`
		DeleteAgain      *apiErr    `json:"delete_again"`
		KeysAfter        [][]string `json:"keys_after"`
		WrongRegion      *apiErr    `json:"wrong_region"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("script output %q: %v", out, err)
	}
	is := func(e *apiErr, code string, status int, msg string) bool {
		return e != nil && e.Code == code && e.Status == status && strings.Contains(e.Message, msg)
	}
	const arn = "arn:aws:iam::123456789012:user/sts-emulator"
	checks := []struct {
		name string
		ok   bool
	}{
		{"GetUser", got.User.Name == "sts-emulator" && got.User.Arn == arn && strings.HasPrefix(got.User.ID, "AIDA") &&
			got.User.Path == "/" && got.User.Created != ""},
		{"ListAccessKeys", reflect.DeepEqual(got.KeysBefore, [][]string{{DefaultAccessKey, "Active"}}) && !got.Truncated},
		{"CreateAccessKey", akiaRE.MatchString(got.Created.ID) && got.Created.SecretLen == 40 && got.Created.Status == "Active" &&
			got.Created.User == "sts-emulator" && got.Created.Created != ""},
		{"quota", is(got.Quota, "LimitExceeded", 409, "Cannot exceed quota for AccessKeysPerUser: 2")},
		{"new key's identity", got.CallerWithNewKey == arn},
		{"inactive key in STS", is(got.InactiveSTS, "InvalidClientTokenId", 403, "The security token included in the request is invalid.")},
		{"inactive key in IAM", is(got.InactiveIAM, "InvalidClientTokenId", 403, "The security token included in the request is invalid.")},
		{"deleted key in STS", is(got.OldKeySTS, "InvalidClientTokenId", 403, "invalid")},
		{"deleting twice", is(got.DeleteAgain, "NoSuchEntity", 404, "The Access Key with id "+DefaultAccessKey+" cannot be found.")},
		{"keys after rotation", reflect.DeepEqual(got.KeysAfter, [][]string{{got.Created.ID, "Active"}})},
		{"IAM signed for another region", is(got.WrongRegion, "SignatureDoesNotMatch", 403, "not 'eu-central-1'")},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("%s: botocore saw %s", c.name, out)
		}
	}
	if n := e.Stats().Total; n != 14 {
		t.Errorf("emulator counted %d calls, want the script's 14", n)
	}
}
