package awsresilient

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	ststypes "github.com/aws/aws-sdk-go-v2/service/sts/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// stsAPI is the part of *sts.Client the plugin calls. Tests wrap the real
// client (see backendOptions.wrapSTS) to record when each call happens on the
// injected clock while the real SDK still talks HTTP to the STS emulator.
type stsAPI interface {
	AssumeRole(ctx context.Context, params *sts.AssumeRoleInput, optFns ...func(*sts.Options)) (*sts.AssumeRoleOutput, error)
	GetSessionToken(ctx context.Context, params *sts.GetSessionTokenInput, optFns ...func(*sts.Options)) (*sts.GetSessionTokenOutput, error)
	GetFederationToken(ctx context.Context, params *sts.GetFederationTokenInput, optFns ...func(*sts.Options)) (*sts.GetFederationTokenOutput, error)
}

// stsEndpoint is one STS endpoint and its client: the primary first, then
// each fallback in the order configured.
type stsEndpoint struct {
	// url is the configured endpoint; empty means the SDK's default for region.
	url    string
	region string
	api    stsAPI
}

// stsEndpoints returns the STS clients for the current config/root, building
// them on first use. The read lock is the fast path; the write lock re-checks
// because another goroutine may have built them while this one waited.
func (b *backend) stsEndpoints(ctx context.Context) ([]*stsEndpoint, error) {
	b.clientMu.RLock()
	eps := b.clients
	b.clientMu.RUnlock()
	if eps != nil {
		return eps, nil
	}

	b.clientMu.Lock()
	defer b.clientMu.Unlock()
	if b.clients != nil {
		return b.clients, nil
	}
	cfg, err := getRootConfig(ctx, b.storage)
	if err != nil {
		return nil, &refreshError{Code: "StorageError", Message: "reading config/root failed", Retryable: true, cause: err}
	}
	if cfg == nil {
		cfg = defaultRootConfig()
	}

	primaryRegion := cfg.Region
	if cfg.STSRegion != "" {
		primaryRegion = cfg.STSRegion
	}
	urls := append([]string{cfg.STSEndpoint}, cfg.STSFallbackEndpoints...)
	regions := []string{primaryRegion}
	for i := range cfg.STSFallbackEndpoints {
		if i < len(cfg.STSFallbackRegions) {
			regions = append(regions, cfg.STSFallbackRegions[i])
		} else {
			regions = append(regions, primaryRegion)
		}
	}

	built := make([]*stsEndpoint, 0, len(urls))
	var closers []idleCloser
	for i, u := range urls {
		opts := []func(*awsconfig.LoadOptions) error{
			awsconfig.WithRegion(regions[i]),
			// Our retry blocks are the only retry layer: the SDK's standard
			// retryer would multiply every attempt by three and hide throttling.
			awsconfig.WithRetryer(func() aws.Retryer { return aws.NopRetryer{} }),
		}
		if cfg.AccessKey != "" {
			opts = append(opts, awsconfig.WithCredentialsProvider(
				credentials.NewStaticCredentialsProvider(cfg.AccessKey, cfg.SecretKey, "")))
		}
		// Without keys, LoadDefaultConfig resolves the default chain
		// (environment, shared files, web identity, ECS/EC2 metadata) behind
		// the SDK's own aws.CredentialsCache.
		awsCfg, err := awsconfig.LoadDefaultConfig(ctx, opts...)
		if err != nil {
			return nil, &refreshError{Code: "ClientConfigError", Message: sanitizeMessage(err.Error(), cfg.SecretKey), cause: err}
		}
		// Start from the SDK's own transport, which honours AWS_CA_BUNDLE and
		// the proxy settings, but own the *http.Transport so that
		// resetClients can close its idle connections (the SDK's client
		// wraps its transport in a type that cannot).
		tr := awshttp.NewBuildableClient().GetTransport()
		if bc, ok := awsCfg.HTTPClient.(*awshttp.BuildableClient); ok {
			tr = bc.GetTransport()
		}
		awsCfg.HTTPClient = &http.Client{
			Transport: tr,
			// STS never redirects; following one could leak a signed request.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
		closers = append(closers, tr)
		endpoint := u
		var api stsAPI = sts.NewFromConfig(awsCfg, func(o *sts.Options) {
			if endpoint != "" {
				o.BaseEndpoint = aws.String(endpoint)
			}
		})
		if b.wrapSTS != nil {
			api = b.wrapSTS(endpoint, api)
		}
		built = append(built, &stsEndpoint{url: endpoint, region: regions[i], api: api})
	}
	b.clients = built
	b.idle = closers
	b.secretKey = cfg.SecretKey
	return built, nil
}

// idleCloser is implemented by *http.Client.
type idleCloser interface{ CloseIdleConnections() }

// resetClients drops the STS clients so that the next call rebuilds them from
// the current config/root. Called on every config/root write or delete, in
// Invalidate for config/root, and in Clean.
func (b *backend) resetClients() {
	b.clientMu.Lock()
	defer b.clientMu.Unlock()
	for _, c := range b.idle {
		c.CloseIdleConnections()
	}
	b.clients = nil
	b.idle = nil
	b.secretKey = ""
}

// currentSecretKey is the configured secret key, for redaction only.
func (b *backend) currentSecretKey() string {
	b.clientMu.RLock()
	defer b.clientMu.RUnlock()
	return b.secretKey
}

// callTimeout bounds one STS call: shorter than a block, so that a hung call
// cannot eat the next attempt, and at most 10s, which is far beyond STS's
// normal latency.
func callTimeout(block time.Duration) time.Duration {
	d := block * 4 / 5
	if d > 10*time.Second {
		d = 10 * time.Second
	}
	return d
}

// fetch makes one STS call for the role on this endpoint.
func (ep *stsEndpoint) fetch(ctx context.Context, name string, role *roleEntry) (*cacheEntry, error) {
	duration := aws.Int32(int32(role.TTL / time.Second))
	var (
		creds *ststypes.Credentials
		arn   string
	)
	switch role.CredentialType {
	case credentialTypeAssumedRole:
		in := &sts.AssumeRoleInput{
			RoleArn:         aws.String(role.RoleARN),
			RoleSessionName: aws.String(role.sessionName(name)),
			DurationSeconds: duration,
			PolicyArns:      policyDescriptors(role.PolicyARNs),
			Tags:            stsTags(role.SessionTags),
		}
		if role.ExternalID != "" {
			in.ExternalId = aws.String(role.ExternalID)
		}
		if role.PolicyDocument != "" {
			in.Policy = aws.String(role.PolicyDocument)
		}
		out, err := ep.api.AssumeRole(ctx, in)
		if err != nil {
			return nil, err
		}
		creds = out.Credentials
		if out.AssumedRoleUser != nil {
			arn = aws.ToString(out.AssumedRoleUser.Arn)
		}
	case credentialTypeSessionToken:
		out, err := ep.api.GetSessionToken(ctx, &sts.GetSessionTokenInput{DurationSeconds: duration})
		if err != nil {
			return nil, err
		}
		creds = out.Credentials
	case credentialTypeFederationToken:
		in := &sts.GetFederationTokenInput{
			Name:            aws.String(role.sessionName(name)),
			DurationSeconds: duration,
			PolicyArns:      policyDescriptors(role.PolicyARNs),
			Tags:            stsTags(role.SessionTags),
		}
		if role.PolicyDocument != "" {
			in.Policy = aws.String(role.PolicyDocument)
		}
		out, err := ep.api.GetFederationToken(ctx, in)
		if err != nil {
			return nil, err
		}
		creds = out.Credentials
		if out.FederatedUser != nil {
			arn = aws.ToString(out.FederatedUser.Arn)
		}
	default:
		return nil, &refreshError{Code: "InvalidRole", Message: fmt.Sprintf("unknown credential_type %q", role.CredentialType)}
	}
	if creds == nil {
		return nil, &refreshError{Code: "InvalidCredential", Message: "STS returned no credentials", Retryable: true}
	}
	return &cacheEntry{
		AccessKey:    aws.ToString(creds.AccessKeyId),
		SecretKey:    aws.ToString(creds.SecretAccessKey),
		SessionToken: aws.ToString(creds.SessionToken),
		Expiration:   aws.ToTime(creds.Expiration),
		ARN:          arn,
	}, nil
}

func policyDescriptors(arns []string) []ststypes.PolicyDescriptorType {
	if len(arns) == 0 {
		return nil
	}
	out := make([]ststypes.PolicyDescriptorType, 0, len(arns))
	for _, a := range arns {
		out = append(out, ststypes.PolicyDescriptorType{Arn: aws.String(a)})
	}
	return out
}

func stsTags(tags map[string]string) []ststypes.Tag {
	if len(tags) == 0 {
		return nil
	}
	out := make([]ststypes.Tag, 0, len(tags))
	for _, k := range sortedKeys(tags) {
		out = append(out, ststypes.Tag{Key: aws.String(k), Value: aws.String(tags[k])})
	}
	return out
}

// refreshError is the sanitised outcome of a failed attempt: an AWS error
// code (or one of ours, such as RateLimited or StorageError) and a message
// that is safe to store in status and return to clients.
type refreshError struct {
	Code      string
	Message   string
	Retryable bool
	// cause is the original error, for logs only; never stored or returned.
	cause error
}

func (e *refreshError) Error() string { return e.Code + ": " + e.Message }
func (e *refreshError) Unwrap() error { return e.cause }

// nonRetryableCodes end a refresh cycle at once: asking again with the same
// keys, role and policy gets the same answer. Both the wire code and the
// SDK's exception-style name are listed where they differ.
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
