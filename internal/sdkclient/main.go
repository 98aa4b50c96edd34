// Command sdkclient is the long-running AWS application of the acceptance
// tests: it loads credentials the way any aws-sdk-go-v2 program does
// (config.LoadDefaultConfig, so from the environment: a credential_process
// profile or the container credentials endpoint) and calls STS
// GetCallerIdentity at the endpoint it is given every -interval for
// -duration, printing one JSON line per call: the time, the access key id
// the SDK signed with and its expiry, the ARN, or the error. It never prints
// a secret key or session token.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sts"
)

// Call is one output line.
type Call struct {
	Time       time.Time `json:"time"`
	AccessKey  string    `json:"access_key,omitempty"`
	Expiration time.Time `json:"expiration,omitempty"`
	ARN        string    `json:"arn,omitempty"`
	Err        string    `json:"err,omitempty"`
}

func main() {
	endpoint := flag.String("endpoint", "", "STS endpoint URL (the emulator)")
	duration := flag.Duration("duration", 0, "how long to keep calling (0: one call)")
	interval := flag.Duration("interval", time.Second, "time between calls")
	flag.Parse()
	ctx := context.Background()
	cfg, err := config.LoadDefaultConfig(ctx, config.WithRegion("us-east-1"), config.WithRetryer(func() aws.Retryer { return aws.NopRetryer{} }))
	if err != nil {
		fmt.Fprintln(os.Stderr, "sdkclient: loading the AWS config:", err)
		os.Exit(1)
	}
	client := sts.NewFromConfig(cfg, func(o *sts.Options) { o.BaseEndpoint = aws.String(*endpoint) })
	enc := json.NewEncoder(os.Stdout)
	end := time.Now().Add(*duration)
	for {
		c := Call{Time: time.Now().UTC()}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		// Retrieve returns what the SDK's credential cache holds, the
		// credential the call below signs with.
		if cr, err := cfg.Credentials.Retrieve(cctx); err != nil {
			c.Err = "credentials: " + err.Error()
		} else {
			c.AccessKey, c.Expiration = cr.AccessKeyID, cr.Expires.UTC()
			if out, err := client.GetCallerIdentity(cctx, &sts.GetCallerIdentityInput{}); err != nil {
				c.Err = err.Error()
			} else {
				c.ARN = aws.ToString(out.Arn)
			}
		}
		cancel()
		enc.Encode(c)
		if !time.Now().Add(*interval).Before(end) {
			return
		}
		time.Sleep(*interval)
	}
}
