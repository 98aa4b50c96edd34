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
}

// classify turns any error from an attempt into a refreshError. It uses the
// SDK's and smithy's error types, never the text of the error, to decide
// whether to retry. secretKey is redacted from any message that is kept.
func classify(err error, secretKey string) *refreshError {
	var re *refreshError
	if errors.As(err, &re) {
		return re
	}
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) {
		code := apiErr.ErrorCode()
		if code == "" {
			code = "UnknownError"
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
		return &refreshError{Code: "Timeout", Message: "STS call timed out", Retryable: true, cause: err}
	}
	var sendErr *smithyhttp.RequestSendError
	if errors.As(err, &sendErr) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &netErr) {
		return &refreshError{Code: "ConnectionError", Message: "could not reach STS: " + sanitizeMessage(rootCause(err).Error(), secretKey), Retryable: true, cause: err}
	}
	// A body that does not parse (malformed or truncated XML) is a transient
	// upstream fault. It may hold credential material, so no text is kept.
	var deserErr *smithy.DeserializationError
	var xmlErr *xml.SyntaxError
	var respErr *awshttp.ResponseError
	hasResp := errors.As(err, &respErr)
	if errors.As(err, &deserErr) || errors.As(err, &xmlErr) || (hasResp && respErr.HTTPStatusCode() < 300) {
		return &refreshError{Code: "MalformedResponse", Message: "STS returned a response that could not be parsed", Retryable: true, cause: err}
	}
	if hasResp {
		return &refreshError{
			Code:      fmt.Sprintf("HTTP%d", respErr.HTTPStatusCode()),
			Message:   fmt.Sprintf("STS answered with HTTP status %d", respErr.HTTPStatusCode()),
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
