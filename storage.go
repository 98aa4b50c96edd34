package awsresilient

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/vault/sdk/logical"
)

// The storage layout: every key the plugin writes, and every typed read,
// write, delete and list of them. Handlers and owners call these; this is
// the one file of the plugin package that calls logical.Storage.
//
//	config/root      rootConfig      the AWS keys (seal-wrapped: secret key)
//	config/refresh   refreshConfig   retry policy and rate limit
//	config/rotation  rotationState   root key rotation: outcome, plan, intent
//	roles/<role>     roleEntry       a role's definition
//	cache/<key>      cacheEntry      the one good credential (seal-wrapped)
//	status/<key>     statusEntry     the refresher's record of the key
//	sched/<n>        schedule index shard (schedindex.go): a hint only
//	clock/<host>     hostClocks      a host's estimates of AWS's clocks (awstime.go)
//	probe            the write before an STS call (putProbe): never read
//
// <key> is a credKey in its String form: a role name, or <role>/<entity ID>
// for an entity credential (cache_scope=entity). config/ and cache/ are listed in
// PathsSpecial.SealWrapStorage: they hold the root secret key and issued
// credentials. A failed call returns an error naming the key; what a failed
// write leaves behind is the caller's to mark (see roleStates).
const (
	configRootPath     = "config/root"
	configRefreshPath  = "config/refresh"
	configRotationPath = "config/rotation"
	rolePrefix         = "roles/"
	cachePrefix        = "cache/"
	statusPrefix       = "status/"
	clockPrefix        = "clock/"
	probePath          = "probe"
)

// credKey names one cached credential: a role's own (entity "") or an
// entity's under an entity-scoped role (cache_scope=entity). The mirror, the
// flights, the plan and the owners' functions take it; only the storage
// keys here and the schedule index's entries (schedindex.go) use its String
// form, and parseCredKey is the one way back.
//
// It holds that String form, "role" or "role/entity", and nothing else: a
// key is one string (16 bytes) in every map and plan entry that holds it,
// half of a pair of strings, which at 100 000 roles is several MB of the
// plan's and the mirror's maps. role and entity read its two parts.
type credKey struct{ s string }

// roleKey is the key of the role's own credential.
func roleKey(role string) credKey { return credKey{s: role} }

// entityKey is the key of an entity's credential under role; an empty
// entity is the role's own.
func entityKey(role, entity string) credKey {
	if entity == "" {
		return roleKey(role)
	}
	return credKey{s: role + entitySep + entity}
}

// role is the name of the key's role.
func (k credKey) role() string {
	if i := strings.Index(k.s, entitySep); i >= 0 {
		return k.s[:i]
	}
	return k.s
}

// entity is the key's entity ID, "" for a role's own credential.
func (k credKey) entity() string {
	if i := strings.Index(k.s, entitySep); i >= 0 {
		return k.s[i+len(entitySep):]
	}
	return ""
}

// isEntity reports whether the key names an entity credential.
func (k credKey) isEntity() bool { return strings.Contains(k.s, entitySep) }

// entitySep joins a role name and an entity ID in a key's String form. Role
// names match framework.GenericNameRegex, which has no slash, and Vault's
// entity IDs are UUIDs, so the form splits one way only.
const entitySep = "/"

// String is the key as storage (cache/<key>, status/<key>) and the schedule
// index hold it: "role", or "role/entity".
func (k credKey) String() string { return k.s }

// parseCredKey reads a key's String form (a storage key below cache/ or
// status/, an index entry): the role is what precedes the first slash, the
// entity all that follows it. A trailing slash names no entity.
func parseCredKey(s string) credKey {
	role, entity, _ := strings.Cut(s, entitySep)
	return entityKey(role, entity)
}

// entityFolder reports whether a listing entry under cache/ or status/ is
// the folder of a role's entity entries ("<role>/"), and whose.
func entityFolder(listed string) (role string, ok bool) {
	return strings.CutSuffix(listed, entitySep)
}

// readJSON decodes the entry at key into v. It reports false, with v
// untouched, when there is no entry. what names the entry in errors.
func readJSON(ctx context.Context, s logical.Storage, key, what string, v any) (bool, error) {
	entry, err := getEntry(ctx, s, key, what)
	if entry == nil {
		return false, err
	}
	return true, decodeEntry(entry, what, v)
}

// readNew returns the entry at key decoded into a new T, or nil, nil when
// there is none: nothing is allocated for a key that is not stored. Every
// new role is read twice before it exists (the write's existence check and
// its old definition) and its status once; an entry allocated for nothing
// each time sits among the definitions the mirror keeps, in their size class
// (176 bytes), and left their spans a third empty at 100 000 roles
// (BENCHMARKS.md, the heap dump of section f). what names the entry in errors.
func readNew[T any](ctx context.Context, s logical.Storage, key, what string) (*T, error) {
	entry, err := getEntry(ctx, s, key, what)
	if entry == nil {
		return nil, err
	}
	v := new(T)
	if err := decodeEntry(entry, what, v); err != nil {
		return nil, err
	}
	return v, nil
}

// getEntry reads the entry at key: nil, nil when there is none.
func getEntry(ctx context.Context, s logical.Storage, key, what string) (*logical.StorageEntry, error) {
	entry, err := s.Get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", what, err)
	}
	return entry, nil
}

// decodeEntry decodes entry's JSON into v.
func decodeEntry(entry *logical.StorageEntry, what string, v any) error {
	if err := entry.DecodeJSON(v); err != nil {
		return fmt.Errorf("decoding %s: %w", what, err)
	}
	return nil
}

// writeJSON writes v as JSON at key. what names the entry in errors.
func writeJSON(ctx context.Context, s logical.Storage, key, what string, v any) error {
	entry, err := logical.StorageEntryJSON(key, v)
	if err != nil {
		return fmt.Errorf("encoding %s: %w", what, err)
	}
	if err := s.Put(ctx, entry); err != nil {
		return fmt.Errorf("writing %s: %w", what, err)
	}
	return nil
}

// deleteKey deletes key; what names the entry in errors.
func deleteKey(ctx context.Context, s logical.Storage, key, what string) error {
	if err := s.Delete(ctx, key); err != nil {
		return fmt.Errorf("deleting %s: %w", what, err)
	}
	return nil
}

// listUnder lists the keys under prefix (one level: a folder ends in "/").
func listUnder(ctx context.Context, s logical.Storage, prefix string) ([]string, error) {
	keys, err := s.List(ctx, prefix)
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", prefix, err)
	}
	return keys, nil
}

// getRootConfig returns config/root, or nil, nil when it is not set.
func getRootConfig(ctx context.Context, s logical.Storage) (*rootConfig, error) {
	return readNew[rootConfig](ctx, s, configRootPath, "config/root")
}

func putRootConfig(ctx context.Context, s logical.Storage, cfg *rootConfig) error {
	return writeJSON(ctx, s, configRootPath, "config/root", cfg)
}

func deleteRootConfig(ctx context.Context, s logical.Storage) error {
	return deleteKey(ctx, s, configRootPath, "config/root")
}

// getRefreshConfig returns the stored config/refresh, or the defaults.
func getRefreshConfig(ctx context.Context, s logical.Storage) (refreshConfig, error) {
	cfg := defaultRefreshConfig()
	_, err := readJSON(ctx, s, configRefreshPath, "config/refresh", &cfg)
	return cfg, err
}

func putRefreshConfig(ctx context.Context, s logical.Storage, cfg refreshConfig) error {
	return writeJSON(ctx, s, configRefreshPath, "config/refresh", cfg)
}

// getRotationState returns config/rotation, or a zero state when none is
// stored.
func getRotationState(ctx context.Context, s logical.Storage) (*rotationState, error) {
	st := new(rotationState)
	if _, err := readJSON(ctx, s, configRotationPath, "config/rotation", st); err != nil {
		return nil, err
	}
	return st, nil
}

func putRotationState(ctx context.Context, s logical.Storage, st *rotationState) error {
	return writeJSON(ctx, s, configRotationPath, "config/rotation", st)
}

// getRole returns the stored role, or nil, nil when there is none. Its
// credential type is the package's constant, not the decoder's copy
// (internRole).
func getRole(ctx context.Context, s logical.Storage, name string) (*roleEntry, error) {
	r, err := readNew[roleEntry](ctx, s, rolePrefix+name, fmt.Sprintf("role %q", name))
	if r != nil {
		internRole(r)
	}
	return r, err
}

// internRole points the definition's enumerated strings at the package's
// constants. The mirror keeps every role's definition, and the decoder
// allocates each string anew: "assumed_role" is a 16-byte object per role
// (1.6 MB at 100 000 roles) that one constant serves. A value that is not
// one of the constants is kept as it came (validate names it).
func internRole(r *roleEntry) {
	switch r.CredentialType {
	case credentialTypeAssumedRole:
		r.CredentialType = credentialTypeAssumedRole
	case credentialTypeSessionToken:
		r.CredentialType = credentialTypeSessionToken
	case credentialTypeFederationToken:
		r.CredentialType = credentialTypeFederationToken
	}
	if r.CacheScope == cacheScopeEntity {
		r.CacheScope = cacheScopeEntity
	}
}

// putRole writes the role's definition.
func putRole(ctx context.Context, s logical.Storage, name string, role *roleEntry) error {
	return writeJSON(ctx, s, rolePrefix+name, fmt.Sprintf("role %q", name), role)
}

// deleteRole deletes the role's definition (its data first: deleteRoleData).
func deleteRole(ctx context.Context, s logical.Storage, name string) error {
	return deleteKey(ctx, s, rolePrefix+name, fmt.Sprintf("role %q", name))
}

// listRoles returns the stored role names, in the order storage lists them.
func listRoles(ctx context.Context, s logical.Storage) ([]string, error) {
	names, err := s.List(ctx, rolePrefix)
	if err != nil {
		return nil, fmt.Errorf("listing roles: %w", err)
	}
	return names, nil
}

// getCacheEntry returns the stored credential, or nil, nil when there is none.
func getCacheEntry(ctx context.Context, s logical.Storage, key credKey) (*cacheEntry, error) {
	return readNew[cacheEntry](ctx, s, cachePrefix+key.String(), fmt.Sprintf("cached credential of role %q", key))
}

// putCacheEntry writes the key's credential. Only a validated credential
// ever comes here.
func putCacheEntry(ctx context.Context, s logical.Storage, key credKey, c *cacheEntry) error {
	return writeJSON(ctx, s, cachePrefix+key.String(), fmt.Sprintf("cached credential of role %q", key), c)
}

// deleteCacheEntry deletes the key's credential.
func deleteCacheEntry(ctx context.Context, s logical.Storage, key credKey) error {
	return deleteKey(ctx, s, cachePrefix+key.String(), fmt.Sprintf("cached credential of role %q", key))
}

// getStatus returns the stored status, or nil, nil when there is none.
func getStatus(ctx context.Context, s logical.Storage, key credKey) (*statusEntry, error) {
	return readNew[statusEntry](ctx, s, statusPrefix+key.String(), fmt.Sprintf("status of role %q", key))
}

// putStatus writes the refresher's record of the key.
func putStatus(ctx context.Context, s logical.Storage, key credKey, st *statusEntry) error {
	return writeJSON(ctx, s, statusPrefix+key.String(), fmt.Sprintf("status of role %q", key), st)
}

// putProbe writes the probe key: the one write an attempt (or a batch of
// attempts arriving together) makes before it calls STS, to learn that this
// node can still store what the call fetches (lifecycle.canStore). Under
// raft it returns once a quorum committed it, or fails (or blocks until it
// fails) on a leader that lost its quorum. Its value, the writer's clock,
// is for a person reading storage; nothing reads it.
func putProbe(ctx context.Context, s logical.Storage, at time.Time) error {
	if err := s.Put(ctx, &logical.StorageEntry{Key: probePath, Value: []byte(at.UTC().Format(time.RFC3339Nano))}); err != nil {
		return fmt.Errorf("writing the probe before an STS call: %w", err)
	}
	return nil
}

// deleteRoleData deletes the key's cached credential and status: the data a
// definition change or delete removes first, so that a failure half-way
// leaves a cold role rather than an orphan.
func deleteRoleData(ctx context.Context, s logical.Storage, key credKey) error {
	if err := deleteCacheEntry(ctx, s, key); err != nil {
		return err
	}
	return deleteKey(ctx, s, statusPrefix+key.String(), fmt.Sprintf("status of role %q", key))
}

// deleteOrphan deletes prefix+name, an entry whose role is gone.
func deleteOrphan(ctx context.Context, s logical.Storage, prefix, name string) error {
	return deleteKey(ctx, s, prefix+name, "orphaned "+prefix+name)
}

// listEntityKeys returns the keys of the entity credentials the role has an
// entry for in storage (a cached credential, a status or both), sorted by
// entity.
func listEntityKeys(ctx context.Context, s logical.Storage, name string) ([]credKey, error) {
	seen := map[string]bool{}
	for _, prefix := range []string{cachePrefix, statusPrefix} {
		keys, err := s.List(ctx, prefix+name+entitySep)
		if err != nil {
			return nil, fmt.Errorf("listing entity entries of role %q: %w", name, err)
		}
		for _, k := range keys {
			if !strings.HasSuffix(k, "/") {
				seen[k] = true
			}
		}
	}
	ids := make([]string, 0, len(seen))
	for id := range seen {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	keys := make([]credKey, len(ids))
	for i, id := range ids {
		keys[i] = entityKey(name, id)
	}
	return keys, nil
}

// deleteEntityData deletes every entity entry of the role from storage.
func deleteEntityData(ctx context.Context, s logical.Storage, name string) error {
	for _, prefix := range []string{cachePrefix, statusPrefix} {
		keys, err := s.List(ctx, prefix+name+entitySep)
		if err != nil {
			return fmt.Errorf("listing entity entries of role %q: %w", name, err)
		}
		for _, k := range keys {
			if err := s.Delete(ctx, prefix+name+entitySep+k); err != nil {
				return fmt.Errorf("deleting entity entry %s%s%s%s: %w", prefix, name, entitySep, k, err)
			}
		}
	}
	return nil
}

// getHostClocks returns the estimates of AWS's clocks the host named host
// stored, or nil, nil when there are none.
func getHostClocks(ctx context.Context, s logical.Storage, host string) (*hostClocks, error) {
	return readNew[hostClocks](ctx, s, clockPrefix+host, fmt.Sprintf("AWS clock estimates of host %q", host))
}

// putHostClocks writes the host's estimates of AWS's clocks.
func putHostClocks(ctx context.Context, s logical.Storage, host string, c *hostClocks) error {
	return writeJSON(ctx, s, clockPrefix+host, fmt.Sprintf("AWS clock estimates of host %q", host), c)
}
