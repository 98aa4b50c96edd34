package awsresilient

import (
	"context"
	"errors"
	"net/http"
	"sort"

	"github.com/hashicorp/vault/sdk/framework"
	"github.com/hashicorp/vault/sdk/logical"
)

func pathRefresh(b *backend) *framework.Path {
	return &framework.Path{
		Pattern: "refresh/" + framework.GenericNameRegex("name"),
		DisplayAttrs: &framework.DisplayAttributes{
			OperationPrefix: operationPrefixAWSResilient,
			OperationSuffix: "refresh",
		},
		Fields: map[string]*framework.FieldSchema{
			"name": {
				Type:        framework.TypeString,
				Description: "Name of the role.",
				Required:    true,
			},
		},
		Operations: map[logical.Operation]framework.OperationHandler{
			logical.UpdateOperation: &framework.PathOperation{
				Callback: b.pathRefreshWrite,
				Summary:  "Run one refresh cycle for the role now and return its status.",
				// It calls STS and writes the cache: only the active node may.
				ForwardPerformanceStandby:   true,
				ForwardPerformanceSecondary: true,
				DisplayAttrs:                &framework.DisplayAttributes{OperationVerb: "refresh"},
				Responses: map[int][]framework.Response{
					http.StatusOK: {{Description: "OK", Fields: statusResponseFields}},
				},
			},
		},
		HelpSynopsis:    pathRefreshHelpSyn,
		HelpDescription: pathRefreshHelpDesc,
	}
}

func (b *backend) pathRefreshWrite(ctx context.Context, req *logical.Request, data *framework.FieldData) (*logical.Response, error) {
	name := data.Get("name").(string)
	rs, err := b.state.current(ctx, req.Storage, roleKey(name))
	if err != nil {
		return nil, err
	}
	if rs == nil {
		return logical.ErrorResponse("role %q not found", name), nil
	}
	keys := []credKey{roleKey(name)}
	if rs.role.entityScoped() {
		// Every entity credential of the role, each in its own cycle.
		keys = keys[:0]
		for key := range b.state.entityEntries(name)[name] {
			keys = append(keys, key)
		}
		sort.Slice(keys, func(i, j int) bool { return keys[i].entity() < keys[j].entity() })
	}
	// At most inFlight cycles at once, each started as an earlier one
	// ends: a cycle is a goroutine (and its stack) until it commits, and
	// an entity-scoped role may hold max_entities=100 000 credentials.
	inFlight := b.refresher.refreshInFlight()
	flights := make([]*flight, len(keys))
	for i, key := range keys {
		if i >= inFlight {
			if err := awaitRefresh(ctx, flights[i-inFlight]); err != nil {
				return nil, err
			}
		}
		flights[i] = b.flights.wait(key)
		flights[i].waiters.Add(1)
	}
	for _, f := range flights[max(len(flights)-inFlight, 0):] {
		if err := awaitRefresh(ctx, f); err != nil {
			return nil, err
		}
	}
	// A failed cycle is not an error of this request: its outcome is in the
	// status (last_error, failed_cycles), and the cached credential, if any,
	// is still served. The status comes from the owner, which the cycle's
	// commit has just updated, not from a read of storage.
	d, err := b.statusData(ctx, req.Storage, name)
	if err != nil {
		return nil, err
	}
	if d == nil {
		return logical.ErrorResponse("role %q not found", name), nil
	}
	return &logical.Response{Data: d}, nil
}

// maxRefreshInFlight bounds the cycles one refresh/<name> runs at once for
// an entity-scoped role (refreshInFlight).
const maxRefreshInFlight = 32

// awaitRefresh waits for f's cycle to end: an error (a 503) when the
// request ends first or the plugin is shutting down.
func awaitRefresh(ctx context.Context, f *flight) error {
	select {
	case <-f.done:
	case <-ctx.Done():
		return logical.CodedError(http.StatusServiceUnavailable, "the request ended before the refresh cycle finished")
	}
	if errors.Is(f.res.err, errShuttingDown) {
		return logical.CodedError(http.StatusServiceUnavailable, "the plugin is shutting down")
	}
	return nil
}

const pathRefreshHelpSyn = `Run one refresh cycle for a role now.`

const pathRefreshHelpDesc = `
Runs one refresh cycle for the role (or joins the one already running) and
returns the resulting status, as status/<name> does. A failed cycle is
reported in the status (last_error, failed_cycles) and leaves the cached
credential in place.

For a role with cache_scope=entity, one cycle runs for each entity credential
the role holds, at most 32 at once (fewer when sts_rate_limit grants fewer
calls in a retry block), and the status reports them in aggregate.
`
