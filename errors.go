package awsresilient

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"unicode/utf8"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/awsclock"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// refreshError is the sanitised outcome of a failed attempt: an AWS error
// code (or one of ours, such as RateLimited or StorageError) and a message
// that is safe to store in status and return to clients.
type refreshError struct {
	Code      string
	Message   string
	Retryable bool
	// cause is the original error, for logs only; never stored or returned.
	cause error
	// rejected, for a credential that validation refused, says why in a
	// word for the metrics (aws_resilient_credentials_rejected_total).
	rejected string
}

func (e *refreshError) Error() string { return e.Code + ": " + e.Message }
func (e *refreshError) Unwrap() error { return e.cause }

// codeClockSkew is the code of an answer in which AWS refused a request
// for its signature's time (awsclock.IsSkewError): AWS's own name for it
// where the service has one (STS and IAM answer SignatureDoesNotMatch).
const codeClockSkew = "RequestTimeTooSkewed"

// nonRetryableCodes end a refresh cycle at once: asking again with the same
// keys, role and policy gets the same answer. Both the wire code and the
// SDK's exception-style name are listed where they differ.
// codeTemplateFailed is the error code of an entity credential's attempt
// whose session_name_template failed for the entity: not retried, and a
// cold read answers it with a 400 (the role's mistake).
const codeTemplateFailed = "TemplateFailed"

var nonRetryableCodes = map[string]bool{
	"AccessDenied":                     true,
	"AccessDeniedException":            true,
	"InvalidClientTokenId":             true,
	"UnrecognizedClientException":      true,
	"SignatureDoesNotMatch":            true,
	"IncompleteSignature":              true,
	"MissingAuthenticationToken":       true,
	"InvalidAction":                    true,
	"InvalidParameterValue":            true,
	"InvalidParameterCombination":      true,
	"ValidationError":                  true,
	"MalformedPolicyDocument":          true,
	"MalformedPolicyDocumentException": true,
	"PackedPolicyTooLarge":             true,
	"PackedPolicyTooLargeException":    true,
	"RegionDisabledException":          true,
	"ExpiredToken":                     true,
	"ExpiredTokenException":            true,
	"IDPRejectedClaim":                 true,
	"InvalidIdentityToken":             true,
	"OptInRequired":                    true,
	"NotAuthorized":                    true,
	// IAM, during a root key rotation: the operator must act first.
	"LimitExceeded":       true,
	"NoSuchEntity":        true,
	"EntityAlreadyExists": true,
	"InvalidInput":        true,
	// Ours: the role or the client configuration cannot work as written.
	"InvalidRole":       true,
	"ClientConfigError": true,
	codeNoAWSIdentity:   true,
}

// codeNoAWSIdentity is ours: no static keys in config/root and nothing in
// the default credential chain, so no call can even be signed.
const codeNoAWSIdentity = "NoAWSIdentity"

// noIdentityError marks a failure of the default credential chain (see
// identityProvider): the SDK reports it as plain wrapped text, so the
// plugin types it where it asks for the credentials.
type noIdentityError struct{ cause error }

func (e *noIdentityError) Error() string { return e.cause.Error() }
func (e *noIdentityError) Unwrap() error { return e.cause }

// operatorCodes are the non-retryable codes that say the operator's set-up
// is wrong (keys, permissions, trust, the role's definition), not that AWS
// is down: a creds read answers them with a 400 that says where to look,
// as a root key rotation does, instead of a 503.
var operatorCodes = map[string]string{
	codeNoAWSIdentity: "Vault has no AWS identity to call STS with: write access_key and secret_key to " +
		"config/root, or give Vault's host an AWS identity (environment, shared credentials file, web " +
		"identity, ECS task role or EC2 instance profile)",
	"AccessDenied": "AWS refused the call: a permission problem, not an outage. Check that the target role's trust " +
		"policy trusts Vault's identity (and allows sts:SetSourceIdentity for cache_scope=entity, " +
		"sts:TagSession for session_tags), that Vault's identity may call the action on the role, and " +
		"that role_arn names the right account",
	"AccessDeniedException": "AWS refused the call: a permission problem, not an outage. Check the target role's " +
		"trust policy and Vault's identity's permissions",
	"InvalidClientTokenId": "AWS does not know the access key Vault signs with: a key problem, not an outage. " +
		"Check access_key in config/root (deleted, inactive or mistyped?) or Vault's host identity",
	"UnrecognizedClientException": "AWS does not know the access key Vault signs with: a key problem, not an " +
		"outage. Check access_key in config/root",
	"SignatureDoesNotMatch": "AWS rejected the signature: secret_key in config/root does not belong to access_key",
	"ExpiredToken":          "the credentials Vault signs with have expired: check Vault's host identity or config/root",
	"ExpiredTokenException": "the credentials Vault signs with have expired: check Vault's host identity or config/root",
	"RegionDisabledException": "STS is not activated in this region for the account: activate it in IAM " +
		"(Account settings) or set region/sts_endpoint in config/root to another region",
	"MalformedPolicyDocument": "STS refused the role's policy_document: fix it with a role write",
	"PackedPolicyTooLarge":    "the role's session policies and tags are too large for STS: shorten policy_document, policy_arns or session_tags",
	"ValidationError":         "STS refused a parameter of the role: check the role's definition",
	"InvalidRole":             "the role cannot work as written: fix it with a role write",
	"ClientConfigError":       "the AWS client could not be configured from config/root",
	codeSourceRing: "the chain's source_roles run in a ring, which no credential can sign: break it with a role write " +
		"(source_role=\"\" or another source on one of its roles)",
}

// operatorHint returns what the operator should do about an error with this
// code, and whether the code is one the operator must fix (see operatorCodes).
func operatorHint(code string) (string, bool) {
	h, ok := operatorCodes[code]
	return h, ok
}

// classify turns any error from an attempt into a refreshError. It uses the
// SDK's and smithy's error types, never the text of the error, to decide
// whether to retry. secretKey is redacted from any message that is kept.
func classify(err error, secretKey string) *refreshError {
	var re *refreshError
	if errors.As(err, &re) {
		return re
	}
	// The SDK names the service of a failed operation; the messages below
	// use it, so that an IAM call's failure does not read as STS's.
	service := "STS"
	var opErr *smithy.OperationError
	if errors.As(err, &opErr) && opErr.Service() != "" {
		service = opErr.Service()
	}
	var noID *noIdentityError
	if errors.As(err, &noID) {
		// Checked first: the chain's last source (EC2 IMDS) failing to
		// connect would otherwise read as a retryable connection error.
		return &refreshError{
			Code:    codeNoAWSIdentity,
			Message: "no AWS credentials: config/root has no access_key and the default credential chain found none (" + sanitizeMessage(noID.Error(), secretKey) + ")",
			cause:   err,
		}
	}
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) {
		code := apiErr.ErrorCode()
		if code == "" {
			code = "UnknownError"
		}
		if awsclock.IsSkewError(code, apiErr.ErrorMessage()) {
			// AWS refused the request's time, not its key: the answer's
			// Date has corrected this endpoint's clock (awsClocks), so
			// the next attempt, signed on AWS's clock, can succeed. Not a
			// SignatureDoesNotMatch to fix in config/root.
			return &refreshError{
				Code:      codeClockSkew,
				Message:   sanitizeMessage(apiErr.ErrorMessage(), secretKey) + " (" + code + ": this host's clock is off AWS's; the next attempt signs on AWS's clock)",
				Retryable: true,
				cause:     err,
			}
		}
		return &refreshError{
			Code:      code,
			Message:   sanitizeMessage(apiErr.ErrorMessage(), secretKey),
			Retryable: !nonRetryableCodes[code],
			cause:     err,
		}
	}
	// Transport failures come wrapped in a ResponseError with status 0, so
	// look for them before looking at the status.
	var netErr net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &netErr) && netErr.Timeout()) {
		return &refreshError{Code: "Timeout", Message: service + " call timed out", Retryable: true, cause: err}
	}
	var sendErr *smithyhttp.RequestSendError
	if errors.As(err, &sendErr) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &netErr) {
		return &refreshError{Code: "ConnectionError", Message: "could not reach " + service + ": " + sanitizeMessage(rootCause(err).Error(), secretKey), Retryable: true, cause: err}
	}
	// A body that does not parse (malformed or truncated XML) is a transient
	// upstream fault. It may hold credential material, so no text is kept.
	var deserErr *smithy.DeserializationError
	var xmlErr *xml.SyntaxError
	var respErr *awshttp.ResponseError
	hasResp := errors.As(err, &respErr)
	if errors.As(err, &deserErr) || errors.As(err, &xmlErr) || (hasResp && respErr.HTTPStatusCode() < 300) {
		return &refreshError{Code: "MalformedResponse", Message: service + " returned a response that could not be parsed", Retryable: true, cause: err}
	}
	if hasResp {
		return &refreshError{
			Code:      fmt.Sprintf("HTTP%d", respErr.HTTPStatusCode()),
			Message:   fmt.Sprintf("%s answered with HTTP status %d", service, respErr.HTTPStatusCode()),
			Retryable: true,
			cause:     err,
		}
	}
	// Unknown errors are retried: the cost of a wasted attempt is small next
	// to giving up on a transient fault nobody anticipated.
	return &refreshError{Code: "UnknownError", Message: sanitizeMessage(err.Error(), secretKey), Retryable: true, cause: err}
}

// rootCause unwraps err as far as it goes along single-error chains.
func rootCause(err error) error {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return err
		}
		err = next
	}
}

// sanitizeMessage keeps an upstream message fit for status and for clients:
// one line, at most 256 characters, without any signing detail (AWS's
// SignatureDoesNotMatch text includes the canonical request) and without the
// configured secret key.
func sanitizeMessage(msg, secretKey string) string {
	for _, cut := range []string{"\n", "The Canonical String", "The String-to-Sign", "canonical request"} {
		if i := strings.Index(msg, cut); i >= 0 {
			msg = msg[:i]
		}
	}
	if secretKey != "" {
		msg = strings.ReplaceAll(msg, secretKey, "[redacted]")
	}
	msg = strings.TrimSpace(msg)
	const max = 256
	if len(msg) > max {
		msg = msg[:max]
		for !utf8.ValidString(msg) {
			msg = msg[:len(msg)-1]
		}
		msg += "..."
	}
	return msg
}
