//go:build !testhooks

package awsresilient

import (
	"github.com/hashicorp/vault/sdk/framework"
	"github.com/hashicorp/vault/sdk/logical"
)

// testHooksBuilt reports whether this binary carries the test hooks: a
// production build has none (see testhooks.go, built with -tags testhooks).
const testHooksBuilt = false

func testHookPaths(*backend) []*framework.Path { return nil }

func (b *backend) wrapStorage(s logical.Storage) logical.Storage { return s }
