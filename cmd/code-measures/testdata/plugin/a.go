package plugin

import "context"

// a.go: hot, warm, storage and name (promoted from base: not counted)
// selected; takes the store lock; calls logical.Storage; splits a key.
func (b *backend) a(ctx context.Context, d *decoy) error {
	b.hot++
	b.warm++
	_ = b.name
	_ = d.hot
	l := b.state.lockFor("r")
	l.Lock()
	defer l.Unlock()
	_, err := b.storage.Get(ctx, "k")
	role, _ := splitKey("r/e")
	_ = role
	return err
}

// six has 6 parameters and 1 bool.
func six(a, b, c int, d, e string, f bool) {}

// five has 5 parameters: not over 5.
func five(a, b, c, d, e int) {}

// many has 6 parameters besides its receiver.
func (b *backend) many(a, b2, c, d, e, f int) {}
