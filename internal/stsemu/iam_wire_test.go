package stsemu

import (
	"encoding/hex"
	"encoding/xml"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/service/iam"
)

// signedFor posts a form body signed with the SDK's signer for the given
// service and region with the default root key, and returns the response.
func signedFor(t *testing.T, e *Emulator, body, service, region string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.URL()+"/", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded; charset=utf-8")
	sum := sha256Sum([]byte(body))
	creds := aws.Credentials{AccessKeyID: DefaultAccessKey, SecretAccessKey: DefaultSecretKey}
	if err := v4.NewSigner().SignHTTP(ctx, creds, req, hex.EncodeToString(sum[:]), service, region, time.Now()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(raw)
}

const (
	iamNS    = `xmlns="https://iam.amazonaws.com/doc/2010-05-08/"`
	iamReqID = `[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}`
	iamMeta  = `<ResponseMetadata><RequestId>(` + iamReqID + `)</RequestId></ResponseMetadata>`
	iamDate  = `\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ`
)

// TestIAMResponseShapes pins the IAM documents, element order included, to
// the shapes of the IAM API reference.
func TestIAMResponseShapes(t *testing.T) {
	e := startEmulator(t, Config{})
	steps := []struct {
		name       string
		body       string
		wantStatus int
		want       string // regexp of the whole document
	}{
		{"GetUser", "Action=GetUser&Version=2010-05-08", 200,
			`<GetUserResponse ` + iamNS + `><GetUserResult><User><Path>/</Path><UserName>sts-emulator</UserName>` +
				`<UserId>AIDA[A-Z2-7]{17}</UserId><Arn>arn:aws:iam::123456789012:user/sts-emulator</Arn><CreateDate>` + iamDate + `</CreateDate>` +
				`</User></GetUserResult>` + iamMeta + `</GetUserResponse>`},
		{"CreateAccessKey", "Action=CreateAccessKey&Version=2010-05-08", 200,
			`<CreateAccessKeyResponse ` + iamNS + `><CreateAccessKeyResult><AccessKey><UserName>sts-emulator</UserName>` +
				`<AccessKeyId>AKIA[A-Z2-7]{16}</AccessKeyId><Status>Active</Status><SecretAccessKey>[A-Za-z0-9+/]{40}</SecretAccessKey>` +
				`<CreateDate>` + iamDate + `</CreateDate></AccessKey></CreateAccessKeyResult>` + iamMeta + `</CreateAccessKeyResponse>`},
		{"ListAccessKeys", "Action=ListAccessKeys&Version=2010-05-08", 200,
			`<ListAccessKeysResponse ` + iamNS + `><ListAccessKeysResult><UserName>sts-emulator</UserName><AccessKeyMetadata>` +
				`<member><UserName>sts-emulator</UserName><AccessKeyId>AKIAIOSFODNN7EXAMPLE</AccessKeyId><Status>Active</Status><CreateDate>` + iamDate + `</CreateDate></member>` +
				`<member><UserName>sts-emulator</UserName><AccessKeyId>AKIA[A-Z2-7]{16}</AccessKeyId><Status>Active</Status><CreateDate>` + iamDate + `</CreateDate></member>` +
				`</AccessKeyMetadata><IsTruncated>false</IsTruncated></ListAccessKeysResult>` + iamMeta + `</ListAccessKeysResponse>`},
		{"ListAccessKeys truncated", "Action=ListAccessKeys&Version=2010-05-08&MaxItems=1", 200,
			`<ListAccessKeysResponse ` + iamNS + `><ListAccessKeysResult><UserName>sts-emulator</UserName><AccessKeyMetadata>` +
				`<member><UserName>sts-emulator</UserName><AccessKeyId>AKIAIOSFODNN7EXAMPLE</AccessKeyId><Status>Active</Status><CreateDate>` + iamDate + `</CreateDate></member>` +
				`</AccessKeyMetadata><IsTruncated>true</IsTruncated><Marker>AKIA[A-Z2-7]{16}</Marker></ListAccessKeysResult>` + iamMeta + `</ListAccessKeysResponse>`},
		{"CreateAccessKey over quota", "Action=CreateAccessKey&Version=2010-05-08", 409,
			`<ErrorResponse ` + iamNS + `><Error><Type>Sender</Type><Code>LimitExceeded</Code><Message>Cannot exceed quota for AccessKeysPerUser: 2</Message>` +
				`</Error><RequestId>(` + iamReqID + `)</RequestId></ErrorResponse>`},
		{"UpdateAccessKey", "Action=UpdateAccessKey&Version=2010-05-08&AccessKeyId=AKIAIOSFODNN7EXAMPLE&Status=Active", 200,
			`<UpdateAccessKeyResponse ` + iamNS + `>` + iamMeta + `</UpdateAccessKeyResponse>`},
		{"DeleteAccessKey missing", "Action=DeleteAccessKey&Version=2010-05-08&AccessKeyId=AKIAMISSINGMISSING00", 404,
			`<ErrorResponse ` + iamNS + `><Error><Type>Sender</Type><Code>NoSuchEntity</Code><Message>The Access Key with id AKIAMISSINGMISSING00 cannot be found.</Message>` +
				`</Error><RequestId>(` + iamReqID + `)</RequestId></ErrorResponse>`},
	}
	var created string
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			resp, body := signedFor(t, e, st.body, "iam", "us-east-1")
			if resp.StatusCode != st.wantStatus {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, st.wantStatus, body)
			}
			m := regexp.MustCompile(`^` + st.want + `$`).FindStringSubmatch(body)
			if m == nil {
				t.Fatalf("document\n%s\ndoes not match\n%s", body, st.want)
			}
			if id := resp.Header.Get("x-amzn-RequestId"); id != m[len(m)-1] {
				t.Errorf("x-amzn-RequestId %q, body RequestId %q", id, m[len(m)-1])
			}
			if st.name == "CreateAccessKey" {
				created = regexp.MustCompile(`AKIA[A-Z2-7]{16}`).FindString(body)
			}
		})
	}
	t.Run("DeleteAccessKey", func(t *testing.T) {
		resp, body := signedFor(t, e, "Action=DeleteAccessKey&Version=2010-05-08&AccessKeyId="+created, "iam", "us-east-1")
		want := `<DeleteAccessKeyResponse ` + iamNS + `>` + iamMeta + `</DeleteAccessKeyResponse>`
		if resp.StatusCode != 200 || !regexp.MustCompile(`^`+want+`$`).MatchString(body) {
			t.Errorf("got %d %s, want %s", resp.StatusCode, body, want)
		}
	})
}

// TestIAMRouting checks how one endpoint tells IAM from STS: by Action,
// with the credential scope then held to the action's service, and IAM's
// region, as AWS holds it.
func TestIAMRouting(t *testing.T) {
	e := startEmulator(t, Config{})
	const stsNS = `xmlns="https://sts.amazonaws.com/doc/2011-06-15/"`
	tests := []struct {
		name       string
		body       string
		service    string
		region     string
		wantStatus int
		wantCode   string
		wantNS     string
		wantMsg    string
	}{
		{"IAM action signed for iam", "Action=GetUser&Version=2010-05-08", "iam", "us-east-1", 200, "", iamNS, ""},
		{"IAM action signed for sts", "Action=GetUser&Version=2010-05-08", "sts", "us-east-1", 403, "SignatureDoesNotMatch", iamNS,
			"Credential should be scoped to correct service: 'iam'. "},
		{"IAM action signed for another region", "Action=GetUser&Version=2010-05-08", "iam", "eu-west-1", 403, "SignatureDoesNotMatch", iamNS,
			"Credential should be scoped to a valid region, not 'eu-west-1'. "},
		{"STS action signed for iam", "Action=GetCallerIdentity&Version=2011-06-15", "iam", "us-east-1", 403, "SignatureDoesNotMatch", stsNS,
			"Credential should be scoped to correct service: 'sts'. "},
		{"STS action in any region", "Action=GetCallerIdentity&Version=2011-06-15", "sts", "ap-south-1", 200, "", stsNS, ""},
		{"IAM action with STS's version", "Action=GetUser&Version=2011-06-15", "iam", "us-east-1", 400, "InvalidAction", iamNS,
			"Could not find operation GetUser for version 2011-06-15"},
		{"STS action with IAM's version", "Action=GetCallerIdentity&Version=2010-05-08", "sts", "us-east-1", 400, "InvalidAction", stsNS, ""},
		{"unknown action signed for iam", "Action=ListUsers&Version=2010-05-08", "iam", "us-east-1", 400, "InvalidAction", iamNS,
			"Could not find operation ListUsers for version 2010-05-08"},
		{"unknown action signed for sts", "Action=ListUsers&Version=2010-05-08", "sts", "us-east-1", 400, "InvalidAction", stsNS, ""},
		{"no action signed for iam", "Version=2010-05-08", "iam", "us-east-1", 400, "MissingAction", iamNS, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := signedFor(t, e, tc.body, tc.service, tc.region)
			var doc errorResponse
			if resp.StatusCode != 200 {
				if err := xml.Unmarshal([]byte(body), &doc); err != nil {
					t.Fatalf("error document %s: %v", body, err)
				}
			}
			if resp.StatusCode != tc.wantStatus || doc.Error.Code != tc.wantCode {
				t.Fatalf("got %d %q, want %d %q: %s", resp.StatusCode, doc.Error.Code, tc.wantStatus, tc.wantCode, body)
			}
			if !strings.Contains(body, tc.wantNS) {
				t.Errorf("body %s not in namespace %s", body, tc.wantNS)
			}
			if !strings.HasPrefix(doc.Error.Message, tc.wantMsg) {
				t.Errorf("message %q, want %q", doc.Error.Message, tc.wantMsg)
			}
		})
	}

	t.Run("SDK client configured for another region", func(t *testing.T) {
		// With a custom endpoint the SDK signs for the client's region; AWS
		// refuses that for IAM, and so does the emulator.
		client := iam.New(iam.Options{
			Region: "eu-central-1", BaseEndpoint: aws.String(e.URL()), Retryer: aws.NopRetryer{},
			Credentials: rootIAM(e).Options().Credentials,
		})
		_, err := client.GetUser(ctx, &iam.GetUserInput{})
		if code := errorCode(err); code != "SignatureDoesNotMatch" || !strings.Contains(err.Error(), "not 'eu-central-1'") {
			t.Errorf("got %v, want SignatureDoesNotMatch naming the region", err)
		}
	})

	t.Run("unsigned IAM call", func(t *testing.T) {
		resp, err := http.Post(e.URL()+"/", "application/x-www-form-urlencoded", strings.NewReader("Action=GetUser&Version=2010-05-08"))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 403 || !strings.Contains(string(body), "<Code>MissingAuthenticationToken</Code>") || !strings.Contains(string(body), iamNS) {
			t.Errorf("got %d %s", resp.StatusCode, body)
		}
	})
}

// TestActionNamesDisjoint guards the routing: an action name in both APIs
// would make route ambiguous.
func TestActionNamesDisjoint(t *testing.T) {
	for name := range iamActions {
		if _, ok := stsActions[name]; ok {
			t.Errorf("action %s is both STS and IAM", name)
		}
	}
}
