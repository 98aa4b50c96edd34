package awsresilient

import (
	"context"
	"net/http"

	"github.com/hashicorp/vault/sdk/framework"
	"github.com/hashicorp/vault/sdk/logical"
)

func pathsRotation(b *backend) []*framework.Path {
	return []*framework.Path{
		{
			Pattern: "config/rotate-root",
			DisplayAttrs: &framework.DisplayAttributes{
				OperationPrefix: operationPrefixAWSResilient,
				OperationVerb:   "rotate",
				OperationSuffix: "root-credentials",
			},
			Operations: map[logical.Operation]framework.OperationHandler{
				logical.UpdateOperation: &framework.PathOperation{
					Callback:                    b.pathRotateRootWrite,
					Summary:                     "Replace config/root's static access key with a new, verified key of the same IAM user, and delete the old one.",
					ForwardPerformanceStandby:   true,
					ForwardPerformanceSecondary: true,
					Responses: map[int][]framework.Response{
						http.StatusOK: {{
							Description: "OK",
							Fields: map[string]*framework.FieldSchema{
								"access_key": {Type: framework.TypeString, Description: "The new access key id (never its secret).", Required: true},
							},
						}},
					},
				},
			},
			HelpSynopsis:    pathRotateRootHelpSyn,
			HelpDescription: pathRotateRootHelpDesc,
		},
		{
			Pattern: "config/rotation",
			DisplayAttrs: &framework.DisplayAttributes{
				OperationPrefix: operationPrefixAWSResilient,
				OperationVerb:   "read",
				OperationSuffix: "rotation-status",
			},
			Operations: map[logical.Operation]framework.OperationHandler{
				logical.ReadOperation: &framework.PathOperation{
					Callback: b.pathRotationRead,
					Summary:  "Read what the last root key rotation did and when the next scheduled one is due.",
					Responses: map[int][]framework.Response{
						http.StatusOK: {{Description: "OK", Fields: rotationResponseFields}},
					},
				},
			},
			HelpSynopsis:    pathRotationHelpSyn,
			HelpDescription: pathRotationHelpDesc,
		},
	}
}

var rotationResponseFields = map[string]*framework.FieldSchema{
	"last_attempt":   {Type: framework.TypeString, Description: "When the last rotation was tried (RFC 3339); empty if never.", Required: true},
	"last_rotated":   {Type: framework.TypeString, Description: "When a rotation last succeeded (RFC 3339); empty if never.", Required: true},
	"trigger":        {Type: framework.TypeString, Description: "What started the last rotation: manual or scheduled.", Required: true},
	"outcome":        {Type: framework.TypeString, Description: "success, failure, superseded (an operator stored a key during the rotation), or old_key_not_deleted (the new key is in force, the old one lives on: error says why, and the reconciler retries the delete); empty if never tried.", Required: true},
	"error":          {Type: framework.TypeString, Description: "Why the last rotation failed (with the AWS error code); empty after a success.", Required: true},
	"failures":       {Type: framework.TypeInt, Description: "Consecutive failed rotations.", Required: true},
	"next_rotation":  {Type: framework.TypeString, Description: "When the next scheduled rotation is due (RFC 3339); empty when rotation_period is 0.", Required: true},
	"pending_key_id": {Type: framework.TypeString, Description: "A key a rotation created but did not store (or stored without storage confirming it); the next rotation or reconciler pass deletes it unless config/root holds it.", Required: true},
	"retired_key_id": {Type: framework.TypeString, Description: "An old key a rotation replaced but could not delete; the next rotation or reconciler pass deletes it unless config/root holds it.", Required: true},
}

func (b *backend) pathRotateRootWrite(ctx context.Context, req *logical.Request, _ *framework.FieldData) (*logical.Response, error) {
	res, err := b.rotator.rotateRoot(ctx, req.Storage, rotationManual)
	if err != nil {
		return rotationResponse(err)
	}
	resp := &logical.Response{Data: map[string]interface{}{"access_key": res.newID}}
	if res.warning != "" {
		// Still a 200: the new key is in force. The warning names the old
		// key that lives on and why; config/rotation records it.
		resp.AddWarning(res.warning)
	}
	if res.replay != "" {
		resp.AddWarning(res.replay)
	}
	return resp, nil
}

func (b *backend) pathRotationRead(ctx context.Context, req *logical.Request, _ *framework.FieldData) (*logical.Response, error) {
	st, err := getRotationState(ctx, req.Storage)
	if err != nil {
		return nil, err
	}
	return &logical.Response{Data: map[string]interface{}{
		"last_attempt":   formatTime(st.LastAttempt),
		"last_rotated":   formatTime(st.LastRotated),
		"trigger":        st.Trigger,
		"outcome":        st.Outcome,
		"error":          st.Error,
		"failures":       st.Failures,
		"next_rotation":  formatTime(st.NextRotation),
		"pending_key_id": st.PendingKeyID,
		"retired_key_id": st.RetiredKeyID,
	}}, nil
}

const pathRotateRootHelpSyn = `Rotate the static access key in config/root.`

const pathRotateRootHelpDesc = `
Replaces config/root's access_key and secret_key with a new key of the same
IAM user, so that no person knows the key the plugin uses:

  1. iam:GetUser (with the current key) names the user; keys an earlier
     rotation left behind are deleted, once no refresh attempt signs with
     them;
  2. iam:CreateAccessKey makes the new key, with the user's key list and
     IAM's clock recorded just before, which identify its key if the answer
     is lost;
  3. sts:GetCallerIdentity with the new key, on the config/refresh block
     schedule, until STS accepts it (IAM takes seconds to propagate a key);
  4. config/root gets the new key (unless an operator changed the key
     meanwhile: that write wins, and the new key is deleted);
  5. once the refresh attempts that started with the old key have ended,
     and if config/root (read again) still holds the new key,
     iam:DeleteAccessKey deletes it.

It never deletes a key it did not create, and never reports success while
the old key lives: when the old key cannot be deleted the answer is a 200
with a warning naming it and why, config/rotation's outcome is
old_key_not_deleted, and the reconciler retries the delete every minute.
A rotation that fails before step 4 deletes the new key and leaves
config/root exactly as it was; after a failed write of config/root both
keys are kept and recorded. A request that arrives while a rotation runs,
or within 10 seconds of its end with config/root unchanged since, returns
that rotation's result, saying that it is a replay, of which rotation and
when it ended (the vault CLI retries a 5xx twice). The
response carries the new access key id, never its secret. A 400 means the operator must act (no static keys, a
missing IAM permission, a user that already has 2 keys: LimitExceeded); a
503 means AWS trouble, with the AWS error code. The IAM user needs
iam:GetUser, iam:ListAccessKeys, iam:CreateAccessKey and iam:DeleteAccessKey
on itself. For a rotation on a schedule, set rotation_period in config/root.
`

const pathRotationHelpSyn = `Read the root key rotation's record.`

const pathRotationHelpDesc = `
What the last root key rotation (config/rotate-root, or the one scheduled by
config/root's rotation_period) did: when, what started it, its outcome and
error, the consecutive failures, and when the next scheduled one is due. A
failed scheduled rotation is tried again after a growing pause (1 minute,
doubling, up to an hour). pending_key_id and retired_key_id name keys a
rotation left on the IAM user; the next rotation deletes them.
`
