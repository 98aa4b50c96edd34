package stsemu_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	"github.com/aws/smithy-go"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
)

// Example shows the usual test setup: start the emulator on a loopback
// port, point the real SDK client at it with the root key pair, script a
// fault, and count calls afterwards.
func Example() {
	e, err := stsemu.Start(stsemu.Config{MaxLifetime: 30 * time.Second})
	if err != nil {
		panic(err)
	}
	defer e.Close()

	client := sts.New(sts.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(e.URL()),
		Credentials:  credentials.NewStaticCredentialsProvider(stsemu.DefaultAccessKey, stsemu.DefaultSecretKey, ""),
		Retryer:      aws.NopRetryer{}, // one request per call, so Stats match
	})
	in := &sts.AssumeRoleInput{
		RoleArn:         aws.String("arn:aws:iam::123456789012:role/app"),
		RoleSessionName: aws.String("example"),
	}

	e.SetFaults(stsemu.FaultPlan{Sequence: []stsemu.FaultStep{{Fault: stsemu.FaultThrottling, Count: 1}}})
	_, err = client.AssumeRole(context.Background(), in)
	var ae smithy.APIError
	if errors.As(err, &ae) {
		fmt.Println("first call:", ae.ErrorCode())
	}

	out, err := client.AssumeRole(context.Background(), in)
	if err != nil {
		panic(err)
	}
	fmt.Println("second call:", aws.ToString(out.AssumedRoleUser.Arn))
	fmt.Println("lifetime capped:", time.Until(aws.ToTime(out.Credentials.Expiration)) <= 30*time.Second)

	s := e.Stats()
	fmt.Println("AssumeRole ok:", s.Count("AssumeRole", "ok"), "throttled:", s.Count("AssumeRole", "Throttling"))
	// Output:
	// first call: Throttling
	// second call: arn:aws:sts::123456789012:assumed-role/app/example
	// lifetime capped: true
	// AssumeRole ok: 1 throttled: 1
}
