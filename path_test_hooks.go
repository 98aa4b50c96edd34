package awsresilient

import (
	"context"
	"net/http"

	"github.com/hashicorp/vault/sdk/framework"
	"github.com/hashicorp/vault/sdk/logical"
)

// pathTestStorageFaults exists only when the plugin runs with
// AWS_RESILIENT_TEST_HOOKS=1. The fault matrix uses it to make the cache write
// that follows a successful STS call fail, which Vault itself cannot inject.
func pathTestStorageFaults(b *backend) *framework.Path {
	return &framework.Path{
		Pattern: "test/storage-faults",
		DisplayAttrs: &framework.DisplayAttributes{
			OperationPrefix: operationPrefixAWSResilient,
			OperationSuffix: "test-storage-faults",
		},
		Fields: map[string]*framework.FieldSchema{
			"cache_write_failures": {
				Type:        framework.TypeInt,
				Description: "How many of the next cache writes fail, 0 to 1000.",
				Required:    true,
			},
		},
		Operations: map[logical.Operation]framework.OperationHandler{
			logical.ReadOperation: &framework.PathOperation{
				Callback: b.pathTestStorageFaultsRead,
				Summary:  "Read how many cache writes are still set to fail.",
				Responses: map[int][]framework.Response{
					http.StatusOK: {{Description: "OK", Fields: map[string]*framework.FieldSchema{
						"cache_write_failures": {Type: framework.TypeInt, Description: "Cache writes still set to fail.", Required: true},
					}}},
				},
			},
			logical.UpdateOperation: &framework.PathOperation{
				Callback:                    b.pathTestStorageFaultsWrite,
				Summary:                     "Make the next N cache writes fail.",
				ForwardPerformanceStandby:   true,
				ForwardPerformanceSecondary: true,
				Responses: map[int][]framework.Response{
					http.StatusNoContent: {{Description: "No Content"}},
				},
			},
		},
		HelpSynopsis:    "Test hook: inject cache write failures.",
		HelpDescription: "Present only when the plugin runs with AWS_RESILIENT_TEST_HOOKS=1. Makes the next cache_write_failures cache writes after a successful STS call fail, as a storage error would.",
	}
}

func (b *backend) pathTestStorageFaultsRead(context.Context, *logical.Request, *framework.FieldData) (*logical.Response, error) {
	return &logical.Response{Data: map[string]interface{}{
		"cache_write_failures": int(b.cacheWriteFailures.Load()),
	}}, nil
}

func (b *backend) pathTestStorageFaultsWrite(_ context.Context, _ *logical.Request, data *framework.FieldData) (*logical.Response, error) {
	n, ok := data.GetOk("cache_write_failures")
	if !ok {
		return logical.ErrorResponse("cache_write_failures is required (0 to 1000)"), nil
	}
	if n.(int) < 0 || n.(int) > 1000 {
		return logical.ErrorResponse("cache_write_failures must be between 0 and 1000; got %d", n.(int)), nil
	}
	b.cacheWriteFailures.Store(int64(n.(int)))
	return nil, nil
}
