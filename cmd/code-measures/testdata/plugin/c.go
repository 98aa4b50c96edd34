package plugin

import "context"

// c.go: hot and storage selected. It mentions lockFor( only in this
// comment and a string, calls Get on a decoy that is not logical.Storage,
// and calls a roleOf method that is not the key helper.
func (b *backend) c(ctx context.Context, d *decoy) string {
	b.hot = d.Get("lockFor(")
	_ = b.storage
	_ = d.hot
	return d.roleOf()
}
