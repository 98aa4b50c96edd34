package plugin

import (
	"context"

	"github.com/hashicorp/vault/sdk/logical"
)

// b.go: hot, warm and storage selected, through a variable that is not the
// receiver; takes the store lock; lists through a logical.Storage
// parameter; joins a key.
func lists(ctx context.Context, x *backend, s logical.Storage, d *decoy) ([]string, error) {
	x.hot--
	x.warm--
	_ = x.storage
	_ = d.hot
	x.state.lockFor(entityKey("r", "e")).Lock()
	return s.List(ctx, "")
}

// flags has 2 bool parameters.
func flags(a, b bool) {}

// mixed has 2 bool parameters, apart.
func (b *backend) mixed(x bool, y int, z bool) {}

// one has 1 bool parameter.
func one(x bool) {}

type flag bool

// named has 2 parameters of a named bool type, not the predeclared bool.
func named(a, b flag) {}
