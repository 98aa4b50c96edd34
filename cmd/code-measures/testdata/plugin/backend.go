// Package plugin is a fixture for code-measures: every measure has a known
// value here, and a decoy next to each thing that counts.
package plugin

import (
	"sync"

	"github.com/hashicorp/vault/sdk/logical"
)

type base struct {
	name string
}

// backend has 7 fields: base (embedded, one), storage, mu and other (one
// line, two fields), state, hot, warm.
type backend struct {
	*base
	storage   logical.Storage
	mu, other sync.Mutex
	state     *store
	hot       int
	warm      int
}

// newBackend touches every field, but this file is the struct's home and
// does not count toward fields_touched_from_3plus_files: warm is selected
// here and in a.go and b.go only.
func newBackend(s logical.Storage) *backend {
	b := &backend{base: &base{}, storage: s, state: &store{}}
	b.hot, b.warm = 1, 1
	b.mu.Lock()
	b.other.Lock()
	return b
}

// store takes the role store lock through lockFor.
type store struct{ mu sync.Mutex }

func (s *store) lockFor(key string) *sync.Mutex { return &s.mu }

// decoy has a field named hot and a Get method: neither is the backend's
// field nor logical.Storage.
type decoy struct{ hot int }

func (d *decoy) Get(key string) int { return d.hot }

// roleOf, the method, is not the package-level roleOf.
func (d *decoy) roleOf() string { return "" }
