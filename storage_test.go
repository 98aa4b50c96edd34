package awsresilient

import "testing"

// TestCredKeyString: a key's String form is what storage and the schedule
// index hold, and parseCredKey reads it back as keys were always cut: the
// role is what precedes the first slash, the entity all that follows.
func TestCredKeyString(t *testing.T) {
	for _, tc := range []struct {
		s    string
		key  credKey
		same bool // String gives s back
	}{
		{"app", roleKey("app"), true},
		{"app/0f8fad5b-d9cb-469f-a165-70867728950e", entityKey("app", "0f8fad5b-d9cb-469f-a165-70867728950e"), true},
		// Not a Vault entity ID, but kept whole after the first slash.
		{"app/a/b", entityKey("app", "a/b"), true},
		// An empty entity is the role's own credential.
		{"app/", roleKey("app"), false},
		{"", credKey{}, true},
	} {
		got := parseCredKey(tc.s)
		if got != tc.key {
			t.Errorf("parseCredKey(%q) = %#v, want %#v", tc.s, got, tc.key)
		}
		if s := got.String(); (s == tc.s) != tc.same {
			t.Errorf("parseCredKey(%q).String() = %q", tc.s, s)
		}
		if again := parseCredKey(got.String()); again != got {
			t.Errorf("parseCredKey(%q) = %#v after String, want %#v", got.String(), again, got)
		}
	}
}
