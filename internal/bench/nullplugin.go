package bench

import (
	"bytes"
	"context"
	"os"
	"sync"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/vault/sdk/framework"
	"github.com/hashicorp/vault/sdk/logical"
	"github.com/hashicorp/vault/sdk/plugin"
)

// The null plugin is the floor of any external secrets plugin: a framework
// backend, served over Vault's plugin gRPC like aws-resilient, whose reads
// do no work at all. Measured beside aws-resilient it separates what Vault
// charges every external plugin read (the round trip to the plugin process,
// and the lease for a response that carries one) from what the plugin's
// own code costs. The bench binary serves it when run as `<bench>
// null-plugin` (Vault starts it with that argument).

// NullPluginArg is the argument that makes the bench binary a plugin.
const NullPluginArg = "null-plugin"

// ServeNullPlugin serves the null plugin to Vault and returns when Vault
// stops it.
func ServeNullPlugin() {
	if err := plugin.ServeMultiplex(&plugin.ServeOpts{BackendFactoryFunc: nullFactory}); err != nil {
		hclog.New(&hclog.LoggerOptions{}).Error("null plugin shutting down", "error", err)
		os.Exit(1)
	}
}

type nullBackend struct {
	*framework.Backend
	mu   sync.RWMutex // guards data and raw
	data map[string]interface{}
	raw  []byte

	flightsMu sync.Mutex               // guards flights
	flights   map[string]chan struct{} // closed when the name's wait is over
}

// flight answers a read of flight/<name> with the stored data once
// latency has passed since the first read of that name: what a plugin
// that makes one upstream call of that latency for every concurrent
// reader of a cold key, and nothing else, would answer, with a lease as
// the plugin's creds read has. Section d's floor.
func (b *nullBackend) flight(_ context.Context, _ *logical.Request, d *framework.FieldData) (*logical.Response, error) {
	name := d.Get("name").(string)
	b.flightsMu.Lock()
	done, ok := b.flights[name]
	if !ok {
		done = make(chan struct{})
		b.flights[name] = done
		latency := time.Duration(d.Get("latency_ms").(int)) * time.Millisecond
		time.AfterFunc(latency, func() { close(done) })
	}
	b.flightsMu.Unlock()
	<-done
	// Leased, as a creds read of a role with the default lease=true.
	return b.read(true)(context.Background(), nil, nil)
}

// rawLine is one line of the raw body, shaped like a per-role series.
const rawLine = `aws_resilient_null{mount="null",role="role-00000"} 1` + "\n"

func (b *nullBackend) writeRaw(_ context.Context, _ *logical.Request, d *framework.FieldData) (*logical.Response, error) {
	n := d.Get("size").(int)
	raw := bytes.Repeat([]byte(rawLine), n/len(rawLine)+1)[:n]
	b.mu.Lock()
	b.raw = raw
	b.mu.Unlock()
	return nil, nil
}

func (b *nullBackend) readRaw(context.Context, *logical.Request, *framework.FieldData) (*logical.Response, error) {
	b.mu.RLock()
	raw := b.raw
	b.mu.RUnlock()
	return &logical.Response{Data: map[string]interface{}{
		logical.HTTPContentType: "text/plain; version=0.0.4; charset=utf-8",
		logical.HTTPRawBody:     raw,
		logical.HTTPStatusCode:  200,
	}}, nil
}

func nullFactory(ctx context.Context, conf *logical.BackendConfig) (logical.Backend, error) {
	b := &nullBackend{data: map[string]interface{}{}, flights: map[string]chan struct{}{}}
	b.Backend = &framework.Backend{
		BackendType: logical.TypeLogical,
		Help:        "Benchmark control: answers reads from memory, with or without a lease.",
		Secrets: []*framework.Secret{{
			Type: "null",
			Revoke: func(context.Context, *logical.Request, *framework.FieldData) (*logical.Response, error) {
				return nil, nil
			},
		}},
		Paths: []*framework.Path{
			{
				Pattern: "data",
				Fields: map[string]*framework.FieldSchema{
					"access_key":     {Type: framework.TypeString},
					"secret_key":     {Type: framework.TypeString},
					"security_token": {Type: framework.TypeString},
					"expiration":     {Type: framework.TypeString},
					"arn":            {Type: framework.TypeString},
				},
				Operations: map[logical.Operation]framework.OperationHandler{
					logical.ReadOperation:   &framework.PathOperation{Callback: b.read(false)},
					logical.UpdateOperation: &framework.PathOperation{Callback: b.write},
				},
			},
			{
				// raw answers reads with a raw text/plain body of the size
				// last written, built once: the floor of a metrics scrape
				// of that size, which crosses the same gRPC hop.
				Pattern: "raw",
				Fields: map[string]*framework.FieldSchema{
					"size": {Type: framework.TypeInt},
				},
				Operations: map[logical.Operation]framework.OperationHandler{
					logical.ReadOperation:   &framework.PathOperation{Callback: b.readRaw},
					logical.UpdateOperation: &framework.PathOperation{Callback: b.writeRaw},
				},
			},
			{
				// flight/<name>?latency_ms=50: every read of a name waits
				// for the one timer its first read started.
				Pattern: "flight/" + framework.GenericNameRegex("name"),
				Fields: map[string]*framework.FieldSchema{
					"name":       {Type: framework.TypeString},
					"latency_ms": {Type: framework.TypeInt},
				},
				Operations: map[logical.Operation]framework.OperationHandler{
					logical.ReadOperation: &framework.PathOperation{Callback: b.flight},
				},
			},
			{
				Pattern: "leased",
				Operations: map[logical.Operation]framework.OperationHandler{
					logical.ReadOperation: &framework.PathOperation{Callback: b.read(true)},
				},
			},
		},
	}
	if err := b.Setup(ctx, conf); err != nil {
		return nil, err
	}
	return b, nil
}

func (b *nullBackend) write(_ context.Context, _ *logical.Request, d *framework.FieldData) (*logical.Response, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for k := range d.Schema {
		if v, ok := d.GetOk(k); ok {
			b.data[k] = v
		}
	}
	return nil, nil
}

// read answers with the stored data; leased adds a non-renewable one-hour
// lease, as aws-resilient's creds read does.
func (b *nullBackend) read(leased bool) framework.OperationFunc {
	return func(context.Context, *logical.Request, *framework.FieldData) (*logical.Response, error) {
		b.mu.RLock()
		data := make(map[string]interface{}, len(b.data))
		for k, v := range b.data {
			data[k] = v
		}
		b.mu.RUnlock()
		if !leased {
			return &logical.Response{Data: data}, nil
		}
		resp := b.Secret("null").Response(data, nil)
		resp.Secret.TTL = time.Hour
		resp.Secret.MaxTTL = time.Hour
		resp.Secret.Renewable = false
		return resp, nil
	}
}
