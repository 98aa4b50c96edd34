package awsresilient

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/vault/sdk/framework"
	"github.com/hashicorp/vault/sdk/logical"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/memlimit"
)

const (
	credentialTypeAssumedRole     = "assumed_role"
	credentialTypeSessionToken    = "session_token"
	credentialTypeFederationToken = "federation_token"

	defaultRoleTTL = time.Hour
	// STS's own bounds: 15 minutes is its minimum duration, 12 hours the
	// longest session a role can be configured for.
	minRoleTTL = 15 * time.Minute
	maxRoleTTL = 12 * time.Hour

	maxPolicyLength      = 2048 // AWS's limit on a session policy's plaintext
	maxPolicyARNs        = 10
	maxSessionTags       = 50
	maxSessionNameLength = 64
	maxFederationName    = 32
)

var (
	// roleARNRegex: an IAM role ARN in any partition, with an optional path.
	roleARNRegex = regexp.MustCompile(`^arn:aws(-[a-z]+)*:iam::[0-9]{12}:role/([\x21-\x7e]{1,510}/)?[\w+=,.@-]{1,64}$`)
	// policyARNRegex: an IAM managed policy ARN, customer or AWS managed.
	policyARNRegex = regexp.MustCompile(`^arn:aws(-[a-z]+)*:iam::([0-9]{12}|aws):policy/[\x21-\x7e]+$`)
	// sessionNameRegex is AWS's pattern for RoleSessionName and the
	// federated user Name.
	sessionNameRegex = regexp.MustCompile(`^[\w+=,.@-]*$`)
	externalIDRegex  = regexp.MustCompile(`^[\w+=,.@:/-]*$`)
	tagRegex         = regexp.MustCompile(`^[\p{L}\p{Z}\p{N}_.:/=+\-@]*$`)
)

func pathsRoles(b *backend) []*framework.Path {
	return []*framework.Path{
		{
			Pattern: "roles/?$",
			DisplayAttrs: &framework.DisplayAttributes{
				OperationPrefix: operationPrefixAWSResilient,
				OperationSuffix: "roles",
			},
			Fields: listRolesFields,
			Operations: map[logical.Operation]framework.OperationHandler{
				logical.ListOperation: &framework.PathOperation{
					Callback: b.pathRolesList,
					Summary:  "List the roles, in order, a page at a time with after and limit; source_role lists a source's targets.",
					Responses: map[int][]framework.Response{
						http.StatusOK: {{
							Description: "OK",
							Fields: map[string]*framework.FieldSchema{
								"keys": {Type: framework.TypeStringSlice, Description: "Role names."},
							},
						}},
					},
				},
			},
			HelpSynopsis:    pathRolesListHelpSyn,
			HelpDescription: pathRolesListHelpDesc,
		},
		{
			Pattern: "roles/" + framework.GenericNameRegex("name"),
			DisplayAttrs: &framework.DisplayAttributes{
				OperationPrefix: operationPrefixAWSResilient,
				OperationSuffix: "role",
			},
			Fields: map[string]*framework.FieldSchema{
				"name": {
					Type: framework.TypeString,
					Description: "Name of the role: " + roleNameRule + ". Any other name, one with a space say, " +
						"is refused with a 400 that says this rule.",
					Required: true,
				},
				"credential_type": {
					Type:          framework.TypeString,
					Description:   "What STS issues: assumed_role (AssumeRole), session_token (GetSessionToken) or federation_token (GetFederationToken).",
					Default:       credentialTypeAssumedRole,
					AllowedValues: []interface{}{credentialTypeAssumedRole, credentialTypeSessionToken, credentialTypeFederationToken},
				},
				"role_arn": {
					Type:        framework.TypeString,
					Description: "ARN of the IAM role to assume; required for assumed_role, not allowed otherwise.",
				},
				"external_id": {
					Type:        framework.TypeString,
					Description: "External ID passed to AssumeRole (assumed_role only), 2 to 1224 characters.",
				},
				"role_session_name": {
					Type:        framework.TypeString,
					Description: "RoleSessionName for assumed_role (2-64 characters) or the federated user Name for federation_token (2-32 characters), matching [\\w+=,.@-]; default vault-<role name>.",
				},
				"policy_document": {
					Type:        framework.TypeString,
					Description: "Inline session policy, a JSON object of at most 2048 characters (assumed_role and federation_token).",
				},
				"policy_arns": {
					Type:        framework.TypeCommaStringSlice,
					Description: "ARNs of up to 10 managed session policies (assumed_role and federation_token).",
				},
				"session_tags": {
					Type:        framework.TypeKVPairs,
					Description: "Session tags as key=value pairs, up to 50 (assumed_role and federation_token).",
				},
				"ttl": {
					Type:        framework.TypeDurationSecond,
					Description: "Requested credential lifetime, 900s to 12h. STS may issue a shorter one.",
					Default:     int(defaultRoleTTL / time.Second),
				},
				"lease": {
					Type: framework.TypeBool,
					Description: "Whether creds/<name> returns a Vault lease. true (default): a non-renewable lease " +
						"whose TTL is the remaining validity; Vault Agent re-reads at 85-95% of it. false: no lease " +
						"(no storage write per read, no lease holding a copy of the secret) and two more data fields, " +
						"ttl (seconds until the replacement credential is expected in the cache) and rotation_period " +
						"(the credential's issued lifetime), which Vault Agent treats as a rotating secret, re-reading " +
						"after ttl+1 seconds. Changing only this field keeps the cached credential.",
					Default: true,
				},
				"cache_scope": {
					Type: framework.TypeString,
					Description: "role (default): one cached credential shared by every reader of the role. entity: " +
						"one cached, background-refreshed credential per Vault entity that reads the role, its STS " +
						"session named after the entity (session_name_template) with the entity name as " +
						"SourceIdentity, so CloudTrail tells the readers apart. assumed_role only.",
					Default:       cacheScopeRole,
					AllowedValues: []interface{}{cacheScopeRole, cacheScopeEntity},
				},
				"session_name_template": {
					Type: framework.TypeString,
					Description: "cache_scope=entity only: Go template for the RoleSessionName over .Name (the login's name: " +
						"the entity name, or the login alias's name when Vault generated the entity name), .EntityName, " +
						".EntityID, .RoleName, .Metadata (the entity's metadata map), .LoginAlias (the alias of the auth " +
						"mount the entity first read the role through), .Aliases (alias names by auth mount accessor) and " +
						".AliasesByType (by auth mount type); default " + defaultSessionNameTemplate + ". At most 1024 " +
						"bytes, writing at most 512; range, define/template and printf widths are refused, as is a " +
						"template that names two entities alike. A result that is not valid as it is (2 to 64 " +
						"characters of [\\w+=,.@-]) is sanitised (other characters become -, cut to fit) and gets - and " +
						"8 hex digits derived from the entity ID, so that distinct entities never share a session name.",
				},
				"entity_idle_ttl": {
					Type: framework.TypeDurationSecond,
					Description: "cache_scope=entity only: an entity's credential that nobody has read for this long is " +
						"dropped at its next refresh instead of refreshed (until then it is kept and served), and may be " +
						"evicted before that to make room for a new entity; 0 (default) means two credential lifetimes " +
						"(2 x ttl). Changing it keeps the cached credentials.",
				},
				"max_entities": {
					Type: framework.TypeInt,
					Description: "cache_scope=entity only: the most entities the role caches a credential for. A new " +
						"entity beyond it evicts the least recently read credential unread for entity_idle_ttl, or is " +
						"refused with a 400. 0 (default) means 1000. Changing it keeps the cached credentials.",
				},
				"source_role": {
					Type: framework.TypeString,
					Description: "Name of another role of this mount whose cached credential signs this role's AssumeRole " +
						"(role chaining), instead of config/root's identity; empty (default) for none. assumed_role only, " +
						"with a ttl of at most 1h (AWS's cap on chained sessions). The source must exist, be assumed_role " +
						"or session_token (a federation token cannot call AssumeRole) with cache_scope=role, and a chain " +
						"has at most 5 roles, without a cycle. Changing it drops the cached credential.",
				},
				"force": {
					Type: framework.TypeBool,
					Description: "Delete only: delete the role even when other roles name it as their source_role " +
						"(without it such a delete is refused with a 409 naming them); their refreshes then fail until a " +
						"role of this name exists again.",
				},
			},
			ExistenceCheck: b.pathRolesExistenceCheck,
			Operations: map[logical.Operation]framework.OperationHandler{
				logical.ReadOperation: &framework.PathOperation{
					Callback: b.pathRolesRead,
					Summary:  "Read a role.",
					Responses: map[int][]framework.Response{
						http.StatusOK: {{Description: "OK", Fields: roleResponseFields}},
					},
				},
				logical.CreateOperation: &framework.PathOperation{
					Callback:                    b.pathRolesWrite,
					Summary:                     "Create a role.",
					ForwardPerformanceStandby:   true,
					ForwardPerformanceSecondary: true,
					DisplayAttrs:                &framework.DisplayAttributes{OperationVerb: "write"},
					Responses: map[int][]framework.Response{
						http.StatusOK: {{Description: "The role as stored", Fields: roleResponseFields}},
					},
				},
				logical.UpdateOperation: &framework.PathOperation{
					Callback:                    b.pathRolesWrite,
					Summary:                     "Update a role; fields not sent keep their values. A change drops the cached credential.",
					ForwardPerformanceStandby:   true,
					ForwardPerformanceSecondary: true,
					DisplayAttrs:                &framework.DisplayAttributes{OperationVerb: "write"},
					Responses: map[int][]framework.Response{
						http.StatusOK: {{Description: "The role as stored", Fields: roleResponseFields}},
					},
				},
				logical.DeleteOperation: &framework.PathOperation{
					Callback:                    b.pathRolesDelete,
					Summary:                     "Delete a role with its cached credential and status.",
					ForwardPerformanceStandby:   true,
					ForwardPerformanceSecondary: true,
					Responses: map[int][]framework.Response{
						http.StatusNoContent: {{Description: "No Content"}},
					},
				},
			},
			HelpSynopsis:    pathRolesHelpSyn,
			HelpDescription: pathRolesHelpDesc,
		},
	}
}

var roleResponseFields = map[string]*framework.FieldSchema{
	"credential_type":       {Type: framework.TypeString, Description: "assumed_role, session_token or federation_token.", Required: true},
	"role_arn":              {Type: framework.TypeString, Description: "ARN of the IAM role to assume.", Required: true},
	"external_id":           {Type: framework.TypeString, Description: "External ID passed to AssumeRole.", Required: true},
	"role_session_name":     {Type: framework.TypeString, Description: "Session (or federated user) name sent to STS.", Required: true},
	"policy_document":       {Type: framework.TypeString, Description: "Inline session policy.", Required: true},
	"policy_arns":           {Type: framework.TypeCommaStringSlice, Description: "Managed session policy ARNs.", Required: true},
	"session_tags":          {Type: framework.TypeKVPairs, Description: "Session tags.", Required: true},
	"ttl":                   {Type: framework.TypeDurationSecond, Description: "Requested credential lifetime in seconds.", Required: true},
	"lease":                 {Type: framework.TypeBool, Description: "Whether creds/<name> returns a Vault lease.", Required: true},
	"cache_scope":           {Type: framework.TypeString, Description: "role or entity.", Required: true},
	"session_name_template": {Type: framework.TypeString, Description: "cache_scope=entity: the session name template in effect."},
	"entity_idle_ttl":       {Type: framework.TypeDurationSecond, Description: "cache_scope=entity: seconds an unread entity credential is kept."},
	"max_entities":          {Type: framework.TypeInt, Description: "cache_scope=entity: the most entities cached."},
	"source_role":           {Type: framework.TypeString, Description: "The role whose cached credential signs this role's AssumeRole; empty for config/root's identity.", Required: true},
}

func (b *backend) pathRolesExistenceCheck(ctx context.Context, req *logical.Request, data *framework.FieldData) (bool, error) {
	role, err := getRole(ctx, req.Storage, data.Get("name").(string))
	if err != nil {
		return false, err
	}
	return role != nil, nil
}

func (b *backend) pathRolesList(ctx context.Context, req *logical.Request, data *framework.FieldData) (*logical.Response, error) {
	var names []string
	var err error
	if src := data.Get("source_role").(string); src != "" {
		// A source's targets, from the chain index.
		names, err = b.state.chains.targetsOf(ctx, req.Storage, src)
		names = pageOf(names, data.Get("after").(string), data.Get("limit").(int))
	} else {
		names, err = listRolesPage(ctx, req.Storage, data)
	}
	if err != nil {
		return nil, err
	}
	defer b.holdListHeadroom(len(names), listRolesHeadroomPerKey)()
	return logical.ListResponse(names), nil
}

// listPageFields are the paging parameters of LIST roles/ and status/,
// defined as OpenBao's paginated LIST endpoints define them (its ListPage):
// Vault's own sdk has no paged storage List, so the names are listed in
// full and the page is cut from them, which costs a sort and a slice but
// keeps the response, and status/'s per-role work, to the page.
var listPageFields = map[string]*framework.FieldSchema{
	"after": {
		Type: framework.TypeString,
		Description: "Optional: list only the role names that sort after this one (byte order). " +
			"The name need not exist; pass the last name of the previous page to get the next.",
	},
	"limit": {
		Type: framework.TypeInt,
		Description: "Optional: return at most this many role names, an integer; " +
			"0 or less (the default) returns all of them.",
	},
}

// listRolesFields are LIST roles/'s parameters: the page, and the source
// whose targets to list.
var listRolesFields = func() map[string]*framework.FieldSchema {
	m := map[string]*framework.FieldSchema{
		"source_role": {
			Type: framework.TypeString,
			Description: "Optional: list only the roles whose source_role is this role (its targets), " +
				"paged by after and limit likewise.",
		},
	}
	for k, v := range listPageFields {
		m[k] = v
	}
	return m
}()

// listRolesPage returns the role names in byte order, those after data's
// after and at most limit of them. It lists storage, the roles' truth,
// and reads no entry.
func listRolesPage(ctx context.Context, s logical.Storage, data *framework.FieldData) ([]string, error) {
	names, err := listRoles(ctx, s)
	if err != nil {
		return nil, err
	}
	// Storage lists in order on the backends Vault ships, but no interface
	// promises it, and after is only a cursor on a sorted list.
	if !sort.StringsAreSorted(names) {
		sort.Strings(names)
	}
	return pageOf(names, data.Get("after").(string), data.Get("limit").(int)), nil
}

// The memory headroom a LIST takes, per key it returns: about twice what
// the plugin allocates to answer it (the sdk's encoding for gRPC included),
// as a scrape takes (path_metrics.go); status/ costs more per key, its
// key_info being a map per role. The measured allocations are in
// BENCHMARKS.md, "Figures behind the code's constants".
const (
	listRolesHeadroomPerKey  = 256
	listStatusHeadroomPerKey = 3584
	// listHeadroomMin: a page that needs less than this needs none, its
	// copies fit in what the adapted limit leaves between two GCs anyway
	// (at least 4 MiB): roles/ past 16 384 keys, status/ past 1170.
	listHeadroomMin = 4 << 20
)

// holdListHeadroom lends a LIST of keys names perKey bytes of memory
// headroom each, above the plugin's own soft limit (internal/memlimit):
// at 100 000 roles the page's values and the sdk's JSON and protobuf
// copies of them would otherwise make the GC run back to back against the
// limit. The caller defers what it returns, once it knows the page's size
// and before it builds the response. The headroom outlives the handler by
// scrapeHeadroomHold, as a scrape's does: the copies are made after it
// returns, while the sdk encodes and sends the response.
func (b *backend) holdListHeadroom(keys, perKey int) (done func()) {
	n := int64(keys) * int64(perKey)
	if n < listHeadroomMin {
		return func() {}
	}
	release := memlimit.Hold(n)
	return func() { b.clock.AfterFunc(scrapeHeadroomHold, release) }
}

// pageOf returns the part of sorted that comes strictly after after, cut to
// limit entries when limit is positive. Non-positive limits mean no limit,
// as in OpenBao, so that a client's "no limit" of 0 or -1 both work.
func pageOf(sorted []string, after string, limit int) []string {
	i := sort.SearchStrings(sorted, after)
	if i < len(sorted) && sorted[i] == after {
		i++
	}
	page := sorted[i:]
	if limit > 0 && limit < len(page) {
		page = page[:limit]
	}
	return page
}

func (b *backend) pathRolesRead(ctx context.Context, req *logical.Request, data *framework.FieldData) (*logical.Response, error) {
	name := data.Get("name").(string)
	role, err := getRole(ctx, req.Storage, name)
	if err != nil {
		return nil, err
	}
	if role == nil {
		return nil, nil
	}
	return &logical.Response{Data: roleData(name, role)}, nil
}

// roleData is a role as read and as a write answers it.
func roleData(name string, role *roleEntry) map[string]interface{} {
	tags := role.SessionTags
	if tags == nil {
		tags = map[string]string{}
	}
	d := map[string]interface{}{
		"credential_type":   role.CredentialType,
		"role_arn":          role.RoleARN,
		"external_id":       role.ExternalID,
		"role_session_name": role.sessionName(name),
		"policy_document":   role.PolicyDocument,
		"policy_arns":       nonNil(role.PolicyARNs),
		"session_tags":      tags,
		"ttl":               int64(role.TTL / time.Second),
		"lease":             !role.NoLease,
		"cache_scope":       cacheScopeRole,
		"source_role":       role.SourceRole,
	}
	if role.entityScoped() {
		d["cache_scope"] = cacheScopeEntity
		d["session_name_template"] = role.sessionTemplate()
		d["entity_idle_ttl"] = int64(role.entityIdleTTL() / time.Second)
		d["max_entities"] = role.maxEntities()
	}
	return d
}

func (b *backend) pathRolesWrite(ctx context.Context, req *logical.Request, data *framework.FieldData) (*logical.Response, error) {
	name := data.Get("name").(string)
	if _, ok := data.GetOk("force"); ok {
		return logical.ErrorResponse("force is only valid on a delete of the role"), nil
	}
	// A write that may change a chain holds the chains' topology lock
	// exclusively (chain.go), before the store lock.
	src, _ := data.GetOk("source_role")
	h, err := b.state.chains.hold(ctx, req.Storage, name, src != nil && src.(string) != "")
	if err != nil {
		return nil, err
	}
	defer h.release()
	resp, w, err := b.writeRole(ctx, req, data, name, h)
	switch {
	case err != nil:
		b.state.chains.failed(h, name)
	case w != nil:
		// The role's targets are planned under their own store locks,
		// once this role's is released.
		b.state.chains.written(ctx, h, name, w.old, w.role)
	}
	return resp, err
}

// roleWrite is a role write that storage accepted: the definitions before
// and after.
type roleWrite struct{ old, role *roleEntry }

// writeRole is a role write under the role's store lock: it applies the
// fields sent to the stored definition, checks the result (in the mount's
// chains too, under h) and stores it. w is nil when nothing was stored.
func (b *backend) writeRole(ctx context.Context, req *logical.Request, data *framework.FieldData, name string, h topoHold) (resp *logical.Response, w *roleWrite, err error) {
	// The store lock makes "load, change, store, drop the cache" one step
	// against a cycle that is about to store a credential for this role.
	defer b.state.lockRole(roleKey(name))()

	old, err := getRole(ctx, req.Storage, name)
	if err != nil {
		return nil, nil, err
	}
	role := &roleEntry{CredentialType: credentialTypeAssumedRole, TTL: defaultRoleTTL}
	if old != nil {
		copied := *old
		role = &copied
	}
	if v, ok := data.GetOk("credential_type"); ok {
		role.CredentialType = v.(string)
	}
	if v, ok := data.GetOk("role_arn"); ok {
		role.RoleARN = strings.TrimSpace(v.(string))
	}
	if v, ok := data.GetOk("external_id"); ok {
		role.ExternalID = v.(string)
	}
	if v, ok := data.GetOk("role_session_name"); ok {
		role.RoleSessionName = v.(string)
	}
	if v, ok := data.GetOk("policy_document"); ok {
		role.PolicyDocument = strings.TrimSpace(v.(string))
	}
	if v, ok := data.GetOk("policy_arns"); ok {
		role.PolicyARNs = trimAll(v.([]string))
	}
	if v, ok := data.GetOk("session_tags"); ok {
		role.SessionTags = v.(map[string]string)
	}
	if v, ok := data.GetOk("ttl"); ok {
		role.TTL = time.Duration(v.(int)) * time.Second
	}
	if v, ok := data.GetOk("lease"); ok {
		role.NoLease = !v.(bool)
	}
	if v, ok := data.GetOk("source_role"); ok {
		role.SourceRole = strings.TrimSpace(v.(string))
		if src := role.SourceRole; src != "" && !validRoleName(src) {
			// Checked before any storage read of it: a key with ".."
			// is refused by Vault's storage (a 500).
			return logical.ErrorResponse("source_role %q is not a valid role name: a role name is %s", src, roleNameRule), nil, nil
		}
	}
	if msg := applyEntityFields(role, data); msg != "" {
		return logical.ErrorResponse(msg), nil, nil
	}
	if msg := role.validate(name); msg != "" {
		return logical.ErrorResponse(msg), nil, nil
	}
	if msg, err := role.otherPartition(ctx, req.Storage); err != nil || msg != "" {
		return partitionAnswer(msg, err)
	}
	msg, err := b.state.chains.checkWrite(ctx, req.Storage, h, name, role)
	if err != nil {
		return nil, nil, err
	}
	if msg != "" {
		return logical.ErrorResponse(msg), nil, nil
	}
	role.normalize()

	// The answer is the role as stored: a write with a mistyped field
	// (tll=2h) then shows that nothing changed, and the sdk adds its warning
	// naming the fields it ignored, which Vault would drop with an empty
	// answer.
	resp = &logical.Response{Data: roleData(name, role)}
	for _, w := range role.warnings() {
		resp.AddWarning(w)
	}
	if old != nil && reflect.DeepEqual(old, role) {
		// Nothing to change. The comparison is with storage, which a failed
		// earlier write left as it was or with the new definition complete.
		return resp, nil, nil
	}
	// What the role issues changed (or the role is new): whatever is cached
	// under this name was issued for another definition, and goes first.
	if err := b.state.writeRoleLocked(ctx, req.Storage, name, old, role); err != nil {
		return nil, nil, err
	}
	return resp, &roleWrite{old: old, role: role}, nil
}

func (b *backend) pathRolesDelete(ctx context.Context, req *logical.Request, data *framework.FieldData) (*logical.Response, error) {
	name := data.Get("name").(string)
	h, err := b.state.chains.hold(ctx, req.Storage, name, false)
	if err != nil {
		return nil, err
	}
	defer h.release()
	if err := b.state.chains.checkDelete(h, name, data.Get("force").(bool)); err != nil {
		return nil, err
	}
	var old *roleEntry
	if h.exclusive {
		// What the role was, for its targets (chains.written).
		old, err = getRole(ctx, req.Storage, name)
	}
	if err == nil {
		err = b.state.deleteRole(ctx, req.Storage, name)
	}
	if err != nil {
		b.state.chains.failed(h, name)
		return nil, err
	}
	b.state.chains.written(ctx, h, name, old, nil)
	return nil, nil
}

// applyEntityFields applies the cache_scope fields sent. The per-entity
// settings are only valid with cache_scope=entity: sent with role scope they
// are a mistake (400), kept from an earlier entity-scoped definition they
// are cleared.
func applyEntityFields(role *roleEntry, data *framework.FieldData) string {
	if v, ok := data.GetOk("cache_scope"); ok {
		role.CacheScope = v.(string)
	}
	if v, ok := data.GetOk("session_name_template"); ok {
		role.SessionNameTemplate = v.(string)
	}
	if v, ok := data.GetOk("entity_idle_ttl"); ok {
		if v.(int) < 0 {
			return "entity_idle_ttl must not be negative"
		}
		role.EntityIdleTTL = time.Duration(v.(int)) * time.Second
	}
	if v, ok := data.GetOk("max_entities"); ok {
		if v.(int) < 0 {
			return fmt.Sprintf("max_entities must not be negative; got %d", v.(int))
		}
		if v.(int) > maxMaxEntities {
			return fmt.Sprintf("max_entities must be at most %d (the most credentials a mount is measured to hold; "+
				"each costs about 2 KiB of plugin memory and an STS call per refresh); got %d", maxMaxEntities, v.(int))
		}
		role.MaxEntities = v.(int)
	}
	switch role.CacheScope {
	case cacheScopeRole:
		role.CacheScope = "" // stored as before the field existed
	case "", cacheScopeEntity:
	default:
		return fmt.Sprintf("cache_scope must be role or entity; got %q", role.CacheScope)
	}
	if role.entityScoped() {
		return ""
	}
	for _, f := range []string{"session_name_template", "entity_idle_ttl", "max_entities"} {
		if _, ok := data.GetOk(f); ok {
			return fmt.Sprintf("%s is only valid with cache_scope=entity", f)
		}
	}
	role.SessionNameTemplate, role.EntityIdleTTL, role.MaxEntities = "", 0, 0
	return ""
}

// warnings are what a role write says of values it accepts but that defeat
// what the cache is for: an idle ttl shorter than a credential's life
// drops the credentials of ordinary readers, so that each of their reads is
// a cold STS call; many entities cost memory and STS calls.
func (r *roleEntry) warnings() []string {
	if !r.entityScoped() {
		return nil
	}
	var w []string
	if r.EntityIdleTTL > 0 && r.EntityIdleTTL < r.TTL {
		w = append(w, fmt.Sprintf("entity_idle_ttl (%ds) is shorter than ttl (%ds): an entity that does not read "+
			"within %ds of its credential's refresh, or of a reconciler pass (about once a minute), has its "+
			"credential dropped, and its next read waits for an STS call. The default (0) is 2 x ttl",
			int64(r.EntityIdleTTL/time.Second), int64(r.TTL/time.Second), int64(r.EntityIdleTTL/time.Second)))
	}
	if r.MaxEntities > warnMaxEntities {
		w = append(w, fmt.Sprintf("max_entities (%d) lets this role hold that many credentials, each about 2 KiB of "+
			"plugin memory and one STS call per refresh (every %ds x (1 - refresh_fraction)); keep the sum over "+
			"the mount's roles within sts_rate_limit and the memory you plan for",
			r.MaxEntities, int64(r.TTL/time.Second)))
	}
	return w
}

const (
	// maxMaxEntities is the most max_entities a role takes: the mount size
	// the plugin is measured at (BENCHMARKS.md section f).
	maxMaxEntities = 100000
	// warnMaxEntities: above this a write warns of the cost.
	warnMaxEntities = 10000
)

// roleEntry is the stored roles/<name>.
type roleEntry struct {
	CredentialType  string            `json:"credential_type"`
	RoleARN         string            `json:"role_arn,omitempty"`
	ExternalID      string            `json:"external_id,omitempty"`
	RoleSessionName string            `json:"role_session_name,omitempty"`
	PolicyDocument  string            `json:"policy_document,omitempty"`
	PolicyARNs      []string          `json:"policy_arns,omitempty"`
	SessionTags     map[string]string `json:"session_tags,omitempty"`
	TTL             time.Duration     `json:"ttl"`
	// NoLease is the API's lease=false, stored inverted so that roles
	// written before the field existed keep serving leases.
	NoLease bool `json:"no_lease,omitempty"`
	// CacheScope is "" for role scope (stored as before the field existed)
	// or cacheScopeEntity; the other three apply to entity scope only.
	CacheScope          string        `json:"cache_scope,omitempty"`
	SessionNameTemplate string        `json:"session_name_template,omitempty"`
	EntityIdleTTL       time.Duration `json:"entity_idle_ttl,omitempty"`
	MaxEntities         int           `json:"max_entities,omitempty"`
	// SourceRole names the role of the mount whose cached credential signs
	// this role's AssumeRole (chain.go); "" for config/root's identity.
	SourceRole string `json:"source_role,omitempty"`
}

// validate returns a message naming what is wrong and what is allowed, or ""
// when the role can be sent to STS as written. The checks run in this
// order, and the first that fails names the mistake.
func (r *roleEntry) validate(name string) string {
	if msg := r.validateCredentialType(); msg != "" {
		return msg
	}
	if msg := r.validateSessionName(name); msg != "" {
		return msg
	}
	if msg := r.validatePolicies(); msg != "" {
		return msg
	}
	if msg := r.validateSessionTags(); msg != "" {
		return msg
	}
	if r.TTL < minRoleTTL || r.TTL > maxRoleTTL {
		return fmt.Sprintf("ttl must be between %s and %s; got %s", minRoleTTL, maxRoleTTL, r.TTL)
	}
	return ""
}

// otherPartition returns a 400 message when role_arn is in another AWS
// partition than the STS region config/root signs for (sts_region, or
// region): STS refuses such a role, and the read's message would then be
// about its trust policy.
func (r *roleEntry) otherPartition(ctx context.Context, s logical.Storage) (string, error) {
	if r.RoleARN == "" {
		return "", nil
	}
	cfg, err := getRootConfig(ctx, s)
	if err != nil {
		return "", err
	}
	if cfg == nil {
		cfg = defaultRootConfig()
	}
	_, regions := stsTargets(cfg)
	arnPart, _, _ := strings.Cut(strings.TrimPrefix(r.RoleARN, "arn:"), ":")
	if mount := partitionOf(regions[0]).name; arnPart != mount {
		return fmt.Sprintf("role_arn %s is in partition %s, but this mount calls STS in region %s, of partition %s, "+
			"and STS assumes only roles of its own partition: write the ARN of a role in %s (arn:%s:iam::...), or "+
			"set config/root's region (or sts_region) to a region of partition %s",
			r.RoleARN, arnPart, regions[0], mount, mount, mount, arnPart), nil
	}
	return "", nil
}

// partitionAnswer is writeRole's answer to otherPartition's refusal.
func partitionAnswer(msg string, err error) (*logical.Response, *roleWrite, error) {
	if err != nil {
		return nil, nil, err
	}
	return logical.ErrorResponse(msg), nil, nil
}

// validateCredentialType checks the credential type against the cache
// scope, and the fields only assumed_role takes (role_arn, external_id).
func (r *roleEntry) validateCredentialType() string {
	if r.entityScoped() && r.CredentialType != credentialTypeAssumedRole {
		return fmt.Sprintf("cache_scope=entity needs credential_type assumed_role (the session carries the entity's name); got %s", r.CredentialType)
	}
	switch r.CredentialType {
	case credentialTypeAssumedRole:
		if r.RoleARN == "" {
			return "role_arn is required for credential_type assumed_role"
		}
		if !roleARNRegex.MatchString(r.RoleARN) {
			return fmt.Sprintf("role_arn must be an IAM role ARN such as arn:aws:iam::123456789012:role/app; got %q", r.RoleARN)
		}
		if r.ExternalID != "" {
			if n := utf8.RuneCountInString(r.ExternalID); n < 2 || n > 1224 || !externalIDRegex.MatchString(r.ExternalID) {
				return `external_id must be 2 to 1224 characters matching [\w+=,.@:/-]`
			}
		}
	case credentialTypeSessionToken, credentialTypeFederationToken:
		if r.RoleARN != "" {
			return fmt.Sprintf("role_arn is only valid for credential_type assumed_role, not %s", r.CredentialType)
		}
		if r.ExternalID != "" {
			return fmt.Sprintf("external_id is only valid for credential_type assumed_role, not %s", r.CredentialType)
		}
	default:
		return fmt.Sprintf("credential_type must be one of assumed_role, session_token, federation_token; got %q", r.CredentialType)
	}
	return ""
}

// validateSessionName checks what names the STS session: nothing for
// session_token (GetSessionToken takes no name, policy or tags), the
// template for an entity-scoped role, else the session name the role
// sends (role_session_name, or the default from the role's name).
func (r *roleEntry) validateSessionName(name string) string {
	switch {
	case r.CredentialType == credentialTypeSessionToken:
		if r.RoleSessionName != "" {
			return "role_session_name is not valid for credential_type session_token"
		}
		if r.PolicyDocument != "" || len(r.PolicyARNs) != 0 {
			return "policy_document and policy_arns are not valid for credential_type session_token"
		}
		if len(r.SessionTags) != 0 {
			return "session_tags are not valid for credential_type session_token"
		}
	case r.entityScoped():
		// The template names each entity's session.
		if r.RoleSessionName != "" {
			return "role_session_name is not valid with cache_scope=entity: session_name_template names each entity's session"
		}
		if err := checkSessionTemplate(r.sessionTemplate()); err != nil {
			return "session_name_template is not a valid template: " + templateErrorText(err)
		}
	default:
		maxLen := maxSessionNameLength
		if r.CredentialType == credentialTypeFederationToken {
			maxLen = maxFederationName
		}
		sn := r.sessionName(name)
		if len(sn) < 2 || len(sn) > maxLen || !sessionNameRegex.MatchString(sn) {
			return fmt.Sprintf(`role_session_name must be 2 to %d characters matching [\w+=,.@-] for %s; got %q`, maxLen, r.CredentialType, sn)
		}
	}
	return ""
}

// validatePolicies checks the session policies: policy_document a JSON
// object within STS's packed size, policy_arns IAM policy ARNs.
func (r *roleEntry) validatePolicies() string {
	if r.PolicyDocument != "" {
		var obj map[string]interface{}
		if err := json.Unmarshal([]byte(r.PolicyDocument), &obj); err != nil || obj == nil {
			return "policy_document must be a JSON object"
		}
		var compact bytes.Buffer
		if err := json.Compact(&compact, []byte(r.PolicyDocument)); err != nil {
			return "policy_document must be a JSON object"
		}
		if compact.Len() > maxPolicyLength {
			return fmt.Sprintf("policy_document must be at most %d characters without whitespace; got %d", maxPolicyLength, compact.Len())
		}
	}
	if len(r.PolicyARNs) > maxPolicyARNs {
		return fmt.Sprintf("policy_arns takes at most %d ARNs; got %d", maxPolicyARNs, len(r.PolicyARNs))
	}
	for _, a := range r.PolicyARNs {
		if len(a) > 2048 || !policyARNRegex.MatchString(a) {
			return fmt.Sprintf("policy_arns must be IAM policy ARNs such as arn:aws:iam::aws:policy/ReadOnlyAccess; got %q", a)
		}
	}
	return ""
}

// validateSessionTags checks the session tags against what STS accepts.
func (r *roleEntry) validateSessionTags() string {
	if len(r.SessionTags) > maxSessionTags {
		return fmt.Sprintf("session_tags takes at most %d tags; got %d", maxSessionTags, len(r.SessionTags))
	}
	// In key order, so that the same write always names the same tag.
	for _, k := range sortedKeys(r.SessionTags) {
		v := r.SessionTags[k]
		if n := utf8.RuneCountInString(k); n < 1 || n > 128 || !tagRegex.MatchString(k) {
			return fmt.Sprintf(`session_tags key %q must be 1 to 128 characters of letters, digits, spaces and _.:/=+-@%s`,
				k, severalTagsHint(k))
		}
		if utf8.RuneCountInString(v) > 256 || !tagRegex.MatchString(v) {
			return fmt.Sprintf(`session_tags value of key %q must be at most 256 characters of letters, digits, spaces and _.:/=+-@%s`,
				k, severalTagsHint(v))
		}
	}
	return ""
}

// severalTagsHint explains a comma in a tag: the CLI's session_tags=a=1,b=2
// sends one tag, a, whose value is "1,b=2"; several tags are several
// session_tags=k=v arguments (or a JSON object over the API).
func severalTagsHint(s string) string {
	if !strings.Contains(s, ",") {
		return ""
	}
	return fmt.Sprintf(`; got %q. A comma is not allowed: to send several tags, repeat the parameter, `+
		`session_tags=team=payments session_tags=env=dev (or send a JSON object over the API)`, s)
}

// normalize stores the policy compacted and empty collections as nil, so
// that equal definitions compare equal. Call only after validate.
func (r *roleEntry) normalize() {
	if r.PolicyDocument != "" {
		var compact bytes.Buffer
		if json.Compact(&compact, []byte(r.PolicyDocument)) == nil {
			r.PolicyDocument = compact.String()
		}
	}
	if len(r.PolicyARNs) == 0 {
		r.PolicyARNs = nil
	}
	if len(r.SessionTags) == 0 {
		r.SessionTags = nil
	}
}

// equal reports whether two definitions issue the same credentials. lease,
// entity_idle_ttl and max_entities are left out (roleEntry.issuing): they
// change how credentials are served and kept, not what STS issues, so
// changing them must not drop the cache or bump the generation.
func (r *roleEntry) equal(o *roleEntry) bool {
	if r == nil || o == nil {
		return r == o
	}
	a, c := r.issuing(), o.issuing()
	return reflect.DeepEqual(&a, &c)
}

// sessionName is the RoleSessionName (or federated user Name) sent to STS:
// the configured one, or vault-<role name> cut to the length STS allows.
func (r *roleEntry) sessionName(name string) string {
	if r.RoleSessionName != "" {
		return r.RoleSessionName
	}
	if r.CredentialType == credentialTypeSessionToken || r.entityScoped() {
		return ""
	}
	sn := "vault-" + name
	maxLen := maxSessionNameLength
	if r.CredentialType == credentialTypeFederationToken {
		maxLen = maxFederationName
	}
	if len(sn) > maxLen {
		sn = sn[:maxLen]
	}
	return sn
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// roleNameRule is Vault's pattern for a name in a path
// (framework.GenericNameRegex, \w(([\w-.]+)?\w)?), in words.
const roleNameRule = "ASCII letters, digits, _, - and ., beginning and ending with a letter, digit or _ " +
	"(app, app-prod, team.app_1)"

// roleNamePattern is Vault's pattern for a name in a path, whole.
var roleNamePattern = regexp.MustCompile(`^` + framework.GenericNameRegex("name") + `$`)

// validRoleName reports whether name can name a role of a path
// (roleNameRule), and a storage key: Vault's storage refuses ".." in one.
func validRoleName(name string) bool {
	return roleNamePattern.MatchString(name) && !strings.Contains(name, "..")
}

// namedPathPrefixes are the paths that end in a role name.
var namedPathPrefixes = []string{"roles/", "creds/", "status/", "refresh/"}

// badNameMessage answers a request that matched no path because the role
// name in it breaks the naming rule (roles/bad name, creds/app/x): Vault's
// own answer, "unsupported path", says neither that the name is the
// problem nor what a name may be. It returns "" for any other path.
func badNameMessage(path string) string {
	for _, prefix := range namedPathPrefixes {
		if name, ok := strings.CutPrefix(path, prefix); ok && name != "" {
			return fmt.Sprintf("%q is not a valid role name: a role name is %s", name, roleNameRule)
		}
	}
	return ""
}

// unknownTemplateField finds text/template's complaint about a field that
// sessionVars does not have.
var unknownTemplateField = regexp.MustCompile(`can't evaluate field (\w+) in type \S*sessionVars`)

// templateErrorText is checkSessionTemplate's error in a role write's
// words: a field that does not exist is named with the fields that do,
// rather than with the Go type that holds them.
func templateErrorText(err error) string {
	m := unknownTemplateField.FindStringSubmatch(err.Error())
	if m == nil {
		return err.Error()
	}
	t := reflect.TypeOf(sessionVars{})
	fields := make([]string, t.NumField())
	for i := range fields {
		fields[i] = "." + t.Field(i).Name
	}
	return fmt.Sprintf("there is no field .%s; the fields are %s", m[1], strings.Join(fields, ", "))
}

const pathRolesListHelpSyn = `List the roles.`

const pathRolesListHelpDesc = `
Lists the names of the roles defined on this mount, sorted in byte order.

Large mounts can be listed a page at a time: after=<name> returns only the
names that sort after <name> (which need not exist), and limit=<n> returns at
most n names (0 or less, the default, returns all). To walk every role, pass
the last name of each page as the next page's after; an empty page (which
Vault answers with 404, as for an empty list) means the end. Pages are not a
snapshot: a role created or deleted between two pages shows up or not
according to where its name sorts.

Over HTTP the parameters go in the query string:
GET /v1/<mount>/roles?list=true&after=<name>&limit=<n>
`

const pathRolesHelpSyn = `Manage the roles whose credentials the plugin caches and refreshes.`

const pathRolesHelpDesc = `
A role says what STS call issues its credential:

  credential_type=assumed_role      AssumeRole on role_arn (with external_id,
                                    role_session_name, policy_document,
                                    policy_arns, session_tags)
  credential_type=session_token     GetSessionToken for the configured keys
  credential_type=federation_token  GetFederationToken, named by
                                    role_session_name (2-32 characters)

ttl is the requested lifetime, 900s to 12h (default 1h); STS may cap it.
role_session_name defaults to vault-<role name>.

lease (default true) chooses how creds/<name> serves the credential: with a
non-renewable Vault lease, or with lease=false without one, adding ttl and
rotation_period data fields that Vault Agent reads as a rotating secret.
Changing lease alone keeps the cached credential.

cache_scope (default role) chooses who shares a credential. role: every
reader of the role gets the same one. entity: each Vault entity reading the
role gets its own, cached and refreshed in the background like a role's, its
STS session named by session_name_template (default vault-{{.Name}}, the
login's name; see the field) and its SourceIdentity set to that name, so
CloudTrail attributes every action to a Vault identity; no two entities
share either. The role's trust policy must allow sts:SetSourceIdentity. An
entity credential unread for entity_idle_ttl (default 2 x ttl) is dropped at
its next refresh rather than refreshed, and max_entities (default 1000) caps
how many the role holds: a new entity beyond it evicts the least recently
read idle one, or is refused.
Changing lease, entity_idle_ttl or max_entities keeps cached credentials.

Any change to what a role issues drops its cached credential (every entity's
too), so the next read fetches one for the new definition. Deleting a role deletes its cached
credential and status.
`
