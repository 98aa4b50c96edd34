package bench

import (
	"context"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sts"
)

// The herd section compares the plugin's refresher with two policies a
// hand-written refresher commonly has. The driver plays them itself,
// against the same emulator settings and the same due times, so the only
// difference is the policy.

// HerdRole is one role of a herd: when its refresh falls due and when the
// credential it replaces expires.
type HerdRole struct {
	ARN         string
	Due, Expiry time.Time
}

// BaselineConfig is what both baseline policies share.
type BaselineConfig struct {
	Endpoint, AccessKey, SecretKey string
	// Attempts and Block: the fixed policy tries at Due + i*Block for i <
	// Attempts (the plugin's retry window, minus the jitter).
	Attempts int
	Block    time.Duration
	// Pause separates two cycles of the fixed policy, and two refreshes of
	// the SDK policy after a failed one (fixed, no jitter).
	Pause time.Duration
	// CallTimeout bounds one call of the fixed policy (the plugin uses
	// 4/5 of a block).
	CallTimeout time.Duration
}

// RunFixedRetries plays "fixed retries without jitter": every role starts
// at its due time and tries at Due + i*Block with the SDK's retries off; a
// failed cycle is followed by Pause, until the credential expires. It
// returns each role's first success.
func RunFixedRetries(ctx context.Context, cfg BaselineConfig, roles []HerdRole) map[string]time.Time {
	client := stsClient(cfg, aws.NopRetryer{})
	return runPerRole(roles, func(r HerdRole) (time.Time, bool) {
		start := r.Due
		for {
			for i := 0; i < cfg.Attempts; i++ {
				at := start.Add(time.Duration(i) * cfg.Block)
				if !at.Before(r.Expiry) || !sleepUntil(ctx, at) {
					return time.Time{}, false
				}
				if assume(ctx, client, r.ARN, cfg.CallTimeout) {
					return time.Now(), true
				}
			}
			start = start.Add(time.Duration(cfg.Attempts)*cfg.Block + cfg.Pause)
		}
	})
}

// RunSDKStandard plays "a single SDK standard-mode call per refresh": at
// its due time every role makes one AssumeRole with aws-sdk-go-v2's default
// (standard) retryer: 3 attempts, exponential backoff with jitter, and the
// client-wide retry quota; all roles share one client as they would in one
// process. A failed refresh is tried again after Pause, until expiry.
func RunSDKStandard(ctx context.Context, cfg BaselineConfig, roles []HerdRole) map[string]time.Time {
	client := stsClient(cfg, nil)
	return runPerRole(roles, func(r HerdRole) (time.Time, bool) {
		at := r.Due
		for at.Before(r.Expiry) && sleepUntil(ctx, at) {
			callCtx, cancel := context.WithDeadline(ctx, r.Expiry)
			ok := assume(callCtx, client, r.ARN, 0)
			cancel()
			if ok {
				return time.Now(), true
			}
			at = time.Now().Add(cfg.Pause)
		}
		return time.Time{}, false
	})
}

func runPerRole(roles []HerdRole, fn func(HerdRole) (time.Time, bool)) map[string]time.Time {
	var (
		mu  sync.Mutex
		out = make(map[string]time.Time, len(roles))
		wg  sync.WaitGroup
	)
	for _, r := range roles {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if t, ok := fn(r); ok {
				mu.Lock()
				out[r.ARN] = t
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return out
}

// stsClient builds an STS client for the emulator; retryer nil keeps the
// SDK's default, the standard retryer.
func stsClient(cfg BaselineConfig, retryer aws.Retryer) *sts.Client {
	return sts.New(sts.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(cfg.Endpoint),
		Credentials:  credentials.NewStaticCredentialsProvider(cfg.AccessKey, cfg.SecretKey, ""),
		Retryer:      retryer,
	})
}

func assume(ctx context.Context, client *sts.Client, arn string, timeout time.Duration) bool {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	_, err := client.AssumeRole(ctx, &sts.AssumeRoleInput{
		RoleArn:         aws.String(arn),
		RoleSessionName: aws.String("herd-baseline"),
	})
	return err == nil
}

func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-ctx.Done():
		return false
	}
}
