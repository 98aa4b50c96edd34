package awsresilient

import (
	"context"
	"testing"
)

// TestEntity_CredentialsShareTheRoleDefinition (issue 36): a role's entity
// credentials hold the role's one copy of its definition, not one each
// (about 200 bytes of heap per entity credential); an entry loaded again
// from storage, as after an invalidation, shares it too.
func TestEntity_CredentialsShareTheRoleDefinition(t *testing.T) {
	f, _ := newEntityFixture(t, nil)
	f.mustReadAs(entityRole, aliceID)
	f.mustReadAs(entityRole, bobID)
	def := f.b.state.peek(roleKey(entityRole)).role
	alice, bob := f.b.state.peek(entityCred(entityRole, aliceID)), f.b.state.peek(entityCred(entityRole, bobID))
	if def == nil || alice.role != def || bob.role != def {
		t.Fatalf("role definition at %p; alice's entry holds %p, bob's %p: want one copy", def, alice.role, bob.role)
	}
	key := entityCred(entityRole, aliceID)
	f.b.InvalidateKey(context.Background(), cachePrefix+key.String())
	f.mustReadAs(entityRole, aliceID)
	if rs := f.b.state.peek(key); rs.stale || rs.role != def {
		t.Fatalf("reloaded: stale %v, definition at %p; want %p", rs.stale, rs.role, def)
	}
}
