//go:build !testhooks

package awsresilient

import (
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock"
	"github.com/hashicorp/vault/sdk/framework"
	"github.com/hashicorp/vault/sdk/logical"
)

// testHooksBuilt reports whether this binary carries the test hooks: a
// production build has none (see testhooks.go, built with -tags testhooks).
const testHooksBuilt = false

func testHookPaths(*backend) []*framework.Path { return nil }

// testHostClock is the real host clock and name (testhooks.go).
func testHostClock() (clock.Clock, string) { return nil, "" }

// minRotationPeriod is the shortest rotation_period config/root accepts.
func minRotationPeriod() time.Duration { return defaultMinRotationPeriod }

func (b *backend) wrapStorage(s logical.Storage) logical.Storage { return s }

func (b *backend) wrapRequestStorage(s logical.Storage) logical.Storage { return s }
