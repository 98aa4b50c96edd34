package stsemu

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/testtool"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/iam"
	"github.com/aws/aws-sdk-go-v2/service/sts"
)

// iamClientFor is the real IAM client pointed at endpoint, signing for
// region, every connection dialled to e whatever host the URL names.
func iamClientFor(e *Emulator, endpoint, region string) *iam.Client {
	addr := strings.TrimPrefix(e.URL(), "http://")
	dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
	return iam.New(iam.Options{
		Region:       region,
		BaseEndpoint: aws.String(endpoint),
		Credentials:  credentials.NewStaticCredentialsProvider(DefaultAccessKey, DefaultSecretKey, ""),
		Retryer:      aws.NopRetryer{},
		HTTPClient:   &http.Client{Transport: &http.Transport{DialContext: dial}},
	})
}

// TestPartitions drives each partition through the real SDK: IAM accepts
// only the partition's IAM region in the scope (as AWS's IAM refuses any
// other), and every ARN names the partition.
func TestPartitions(t *testing.T) {
	for _, name := range PartitionNames() {
		t.Run(name, func(t *testing.T) {
			p, err := LookupPartition(name)
			if err != nil {
				t.Fatal(err)
			}
			e := startEmulator(t, Config{Partition: name})
			wantUser := "arn:" + name + ":iam::" + DefaultAccount + ":user/" + DefaultIAMUser

			user, err := iamClientFor(e, e.URL(), p.IAMRegion).GetUser(ctx, &iam.GetUserInput{})
			if err != nil {
				t.Fatalf("GetUser signed for %s: %v", p.IAMRegion, err)
			}
			if got := aws.ToString(user.User.Arn); got != wantUser {
				t.Errorf("GetUser arn %s, want %s", got, wantUser)
			}
			// Every other partition's IAM region, and an ordinary region of
			// this one, are refused.
			for _, other := range append(PartitionNames(), "eu-west-1") {
				region := other
				if o, err := LookupPartition(other); err == nil {
					region = o.IAMRegion
				}
				if region == p.IAMRegion {
					continue
				}
				_, err := iamClientFor(e, e.URL(), region).GetUser(ctx, &iam.GetUserInput{})
				if code, status := errorCode(err), httpStatus(err); code != "SignatureDoesNotMatch" || status != 403 ||
					!strings.Contains(err.Error(), "Credential should be scoped to a valid region, not '"+region+"'") {
					t.Errorf("GetUser signed for %s: %q/%d (%v), want 403 SignatureDoesNotMatch", region, code, status, err)
				}
			}

			// The partition's IAM host, dialled to the emulator, serves it;
			// another partition's IAM host does not know its keys.
			if _, err := iamClientFor(e, "http://"+p.IAMHost, p.IAMRegion).GetUser(ctx, &iam.GetUserInput{}); err != nil {
				t.Errorf("GetUser at %s signed for %s: %v", p.IAMHost, p.IAMRegion, err)
			}
			for _, other := range PartitionNames() {
				o, _ := LookupPartition(other)
				if other == name {
					continue
				}
				_, err := iamClientFor(e, "http://"+o.IAMHost, p.IAMRegion).GetUser(ctx, &iam.GetUserInput{})
				if code := errorCode(err); code != "InvalidClientTokenId" {
					t.Errorf("GetUser of a %s key at %s: %q (%v), want InvalidClientTokenId", name, o.IAMHost, code, err)
				}
			}

			// STS: the same user, and assumed roles of this partition only.
			stsc := sts.New(sts.Options{Region: p.IAMRegion, BaseEndpoint: aws.String(e.URL()),
				Credentials: credentials.NewStaticCredentialsProvider(DefaultAccessKey, DefaultSecretKey, ""), Retryer: aws.NopRetryer{}})
			id, err := stsc.GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
			if err != nil || aws.ToString(id.Arn) != wantUser {
				t.Errorf("GetCallerIdentity = %v, %v; want %s", id, err, wantUser)
			}
			role, err := stsc.AssumeRole(ctx, &sts.AssumeRoleInput{
				RoleArn: aws.String("arn:" + name + ":iam::" + DefaultAccount + ":role/app"), RoleSessionName: aws.String("s1"),
			})
			if err != nil {
				t.Fatalf("AssumeRole in %s: %v", name, err)
			}
			if got, want := aws.ToString(role.AssumedRoleUser.Arn), "arn:"+name+":sts::"+DefaultAccount+":assumed-role/app/s1"; got != want {
				t.Errorf("assumed-role arn %s, want %s", got, want)
			}
			for _, other := range PartitionNames() {
				if other == name {
					continue
				}
				_, err := stsc.AssumeRole(ctx, &sts.AssumeRoleInput{
					RoleArn: aws.String("arn:" + other + ":iam::" + DefaultAccount + ":role/app"), RoleSessionName: aws.String("s1"),
				})
				if errorCode(err) != "AccessDenied" {
					t.Errorf("AssumeRole of a role in %s from %s: %v, want AccessDenied", other, name, err)
				}
			}
			if cv := e.ConfigView(); cv.Partition != name || cv.IAMRegion != p.IAMRegion {
				t.Errorf("ConfigView partition %q region %q", cv.Partition, cv.IAMRegion)
			}
		})
	}
}

func TestLookupPartition(t *testing.T) {
	for name, want := range map[string]string{"": "us-east-1", "aws": "us-east-1", "aws-us-gov": "us-gov-west-1", "aws-cn": "cn-north-1"} {
		if p, err := LookupPartition(name); err != nil || p.IAMRegion != want {
			t.Errorf("LookupPartition(%q) = %+v, %v; want IAM region %s", name, p, err, want)
		}
	}
	if _, err := LookupPartition("aws-iso"); err == nil {
		t.Error("LookupPartition(aws-iso) succeeded; the emulator does not play it")
	}
	for host, want := range map[string]string{"iam.us-gov.amazonaws.com": "aws-us-gov", "IAM.cn-north-1.amazonaws.com.cn:443": "aws-cn", "iam.amazonaws.com": "aws"} {
		if p, ok := partitionOfHost(host); !ok || p.Name != want {
			t.Errorf("partitionOfHost(%q) = %+v, %v; want %s", host, p, ok, want)
		}
	}
	if _, ok := partitionOfHost("127.0.0.1:8599"); ok {
		t.Error("partitionOfHost(127.0.0.1:8599) found a partition")
	}
}

// TestAWSCLIPartitions: the awscli (botocore's signer, a second SigV4
// implementation) reaches IAM in GovCloud and China when it signs for the
// partition's IAM region, and is refused when it signs for us-east-1.
func TestAWSCLIPartitions(t *testing.T) {
	bin := testtool.Require(t, "aws", "--version")
	for _, name := range []string{"aws-us-gov", "aws-cn"} {
		t.Run(name, func(t *testing.T) {
			p, _ := LookupPartition(name)
			e := startEmulator(t, Config{Partition: name})
			out, stderr, err := awsCLI(t, bin, e, DefaultAccessKey, DefaultSecretKey, "", "iam", "get-user", "--region", p.IAMRegion)
			if err != nil {
				t.Fatalf("aws iam get-user --region %s: %v\n%s", p.IAMRegion, err, stderr)
			}
			if want := `"Arn": "arn:` + name + `:iam::` + DefaultAccount + `:user/` + DefaultIAMUser + `"`; !strings.Contains(out, want) {
				t.Errorf("get-user printed %s, want %s", out, want)
			}
			_, stderr, err = awsCLI(t, bin, e, DefaultAccessKey, DefaultSecretKey, "", "iam", "get-user", "--region", "us-east-1")
			if err == nil || !strings.Contains(stderr, "SignatureDoesNotMatch") {
				t.Errorf("get-user signed for us-east-1 in %s: err %v, stderr %q; want SignatureDoesNotMatch", name, err, stderr)
			}
		})
	}
}
