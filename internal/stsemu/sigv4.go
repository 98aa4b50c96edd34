package stsemu

// SigV4 verification, written from AWS's "Signature Version 4 signing
// process" documentation and checked in tests against the aws-sdk-go-v2
// signer, botocore and the awscli.

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

const (
	sigAlgorithm  = "AWS4-HMAC-SHA256"
	amzDateLayout = "20060102T150405Z"
)

// sigV4Auth is a parsed Authorization header.
type sigV4Auth struct {
	accessKeyID   string
	date          string // YYYYMMDD of the credential scope
	region        string
	service       string
	signedHeaders []string // as sent, lower case, ';'-separated on the wire
	signature     string
}

// scope is the credential scope string: DATE/REGION/SERVICE/aws4_request.
func (a sigV4Auth) scope() string {
	return a.date + "/" + a.region + "/" + a.service + "/aws4_request"
}

// parseAuthorization parses
// "AWS4-HMAC-SHA256 Credential=AKID/DATE/REGION/SERVICE/aws4_request, SignedHeaders=a;b, Signature=hex".
// Errors are IncompleteSignature with AWS's wording.
func parseAuthorization(v string) (sigV4Auth, *apiError) {
	var a sigV4Auth
	alg, rest, _ := strings.Cut(v, " ")
	if alg != sigAlgorithm {
		return a, apiErr(http.StatusBadRequest, "IncompleteSignature",
			"Unsupported AWS 'algorithm': '"+alg+"'")
	}
	var cred, signed string
	var haveCred, haveSigned, haveSig bool
	for _, part := range strings.Split(rest, ",") {
		k, val, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "Credential":
			cred, haveCred = val, true
		case "SignedHeaders":
			signed, haveSigned = val, true
		case "Signature":
			a.signature, haveSig = val, true
		}
	}
	var missing []string
	if !haveCred {
		missing = append(missing, "Authorization header requires 'Credential' parameter.")
	}
	if !haveSig {
		missing = append(missing, "Authorization header requires 'Signature' parameter.")
	}
	if !haveSigned {
		missing = append(missing, "Authorization header requires 'SignedHeaders' parameter.")
	}
	if len(missing) > 0 {
		return a, apiErr(http.StatusBadRequest, "IncompleteSignature",
			strings.Join(missing, " ")+" Authorization="+redactAuthorization(v))
	}
	parts := strings.Split(cred, "/")
	if len(parts) != 5 || parts[4] != "aws4_request" || parts[0] == "" {
		return a, apiErr(http.StatusBadRequest, "IncompleteSignature",
			"Credential should be scoped to a valid region, not '"+strings.Join(parts[min(2, len(parts)):], "/")+"'. ")
	}
	a.accessKeyID, a.date, a.region, a.service = parts[0], parts[1], parts[2], parts[3]
	a.signedHeaders = strings.Split(signed, ";")
	return a, nil
}

// redactAuthorization drops the signature from an Authorization header so an
// error message can quote the rest.
func redactAuthorization(v string) string {
	if i := strings.Index(v, "Signature="); i >= 0 {
		return v[:i] + "Signature=REDACTED"
	}
	return v
}

// credentialKeyID extracts the access key id from an Authorization header
// for stats and logs, or "" when there is none.
func credentialKeyID(authz string) string {
	_, after, ok := strings.Cut(authz, "Credential=")
	if !ok {
		return ""
	}
	id, _, _ := strings.Cut(after, "/")
	return id
}

// credentialService extracts the service of the credential scope
// (AKID/DATE/REGION/SERVICE/aws4_request), or "" when there is none.
func credentialService(authz string) string {
	_, after, ok := strings.Cut(authz, "Credential=")
	if !ok {
		return ""
	}
	cred, _, _ := strings.Cut(after, ",")
	parts := strings.Split(strings.TrimSpace(cred), "/")
	if len(parts) != 5 {
		return ""
	}
	return parts[3]
}

// authenticate verifies the request signature for API a and returns who
// signed it. The order of checks follows AWS: a key that is unknown,
// deleted, inactive or not yet propagated (or whose session token does not
// match) is InvalidClientTokenId, an expired session token is ExpiredToken,
// then the clock skew, the credential scope (service, and region for IAM)
// and finally the signature itself.
func (e *Emulator) authenticate(r *http.Request, body []byte, a *api, now time.Time) (principal, *apiError) {
	authz := r.Header.Get("Authorization")
	if authz == "" {
		return principal{}, apiErr(http.StatusForbidden, "MissingAuthenticationToken",
			"Request is missing Authentication Token")
	}
	auth, ae := parseAuthorization(authz)
	if ae != nil {
		return principal{}, ae
	}

	if a == iamAPI && e.foreignIAMHost(r) {
		return principal{}, invalidToken()
	}
	token := r.Header.Get("X-Amz-Security-Token")
	var p principal
	var secret string
	if token == "" {
		// A long-term key: any IAM user's, while it is active and its
		// creation has propagated.
		var ok bool
		if p, secret, ok = e.iam.signingKey(auth.accessKeyID, now); !ok {
			return principal{}, invalidToken()
		}
	} else {
		tc, ok := e.openToken(token)
		if !ok || tc.accessKeyID != auth.accessKeyID {
			return principal{}, invalidToken()
		}
		// Expired credentials are rejected before anything else is looked
		// at, so a client learns to refresh rather than to re-sign.
		if !now.Before(tc.expires) {
			return principal{}, apiErr(http.StatusBadRequest, "ExpiredToken",
				"The security token included in the request is expired")
		}
		p = tc.principal
		secret = e.secretFor(tc.accessKeyID)
	}

	amzDate := r.Header.Get("X-Amz-Date")
	if amzDate == "" {
		return principal{}, apiErr(http.StatusBadRequest, "IncompleteSignature",
			"Authorization header requires existence of either a 'X-Amz-Date' or a 'Date' header. Authorization="+redactAuthorization(authz))
	}
	signedAt, err := time.Parse(amzDateLayout, amzDate)
	if err != nil {
		return principal{}, apiErr(http.StatusBadRequest, "IncompleteSignature",
			"Date must be in ISO-8601 'basic format'. Got '"+amzDate+"'. See http://en.wikipedia.org/wiki/ISO_8601")
	}
	if ae := checkSkew(signedAt, e.signNow(), e.skewTolerance); ae != nil {
		return principal{}, ae
	}
	if auth.date != amzDate[:8] {
		return principal{}, apiErr(http.StatusForbidden, "SignatureDoesNotMatch",
			fmt.Sprintf("Date in Credential scope does not match YYYYMMDD from ISO-8601 version of date from HTTP: '%s' != '%s', from '%s'.",
				auth.date, amzDate[:8], amzDate))
	}
	if auth.service != a.service {
		return principal{}, apiErr(http.StatusForbidden, "SignatureDoesNotMatch",
			"Credential should be scoped to correct service: '"+a.service+"'. ")
	}
	if a == iamAPI && auth.region != e.partition.IAMRegion {
		return principal{}, apiErr(http.StatusForbidden, "SignatureDoesNotMatch",
			"Credential should be scoped to a valid region, not '"+auth.region+"'. ")
	}

	want := computeSignature(secret, auth, amzDate, canonicalRequest(r, auth.signedHeaders, body))
	if !hmac.Equal([]byte(want), []byte(strings.ToLower(auth.signature))) {
		return principal{}, apiErr(http.StatusForbidden, "SignatureDoesNotMatch",
			"The request signature we calculated does not match the signature you provided. "+
				"Check your AWS Secret Access Key and signing method. Consult the service documentation for details.")
	}
	return p, nil
}

func invalidToken() *apiError {
	return apiErr(http.StatusForbidden, "InvalidClientTokenId",
		"The security token included in the request is invalid.")
}

// checkSkew rejects a signature time more than tolerance away from now,
// in STS's words: "Signature expired: <signed> is now earlier than <now -
// tolerance> (<now> - 5 min.)", or "not yet current" for one ahead.
func checkSkew(signedAt, now time.Time, tolerance time.Duration) *apiError {
	f := func(t time.Time) string { return t.UTC().Format(amzDateLayout) }
	mins := strconv.FormatFloat(tolerance.Minutes(), 'f', -1, 64)
	switch {
	case signedAt.Before(now.Add(-tolerance)):
		return apiErr(http.StatusForbidden, "SignatureDoesNotMatch",
			fmt.Sprintf("Signature expired: %s is now earlier than %s (%s - %s min.)",
				f(signedAt), f(now.Add(-tolerance)), f(now), mins))
	case signedAt.After(now.Add(tolerance)):
		return apiErr(http.StatusForbidden, "SignatureDoesNotMatch",
			fmt.Sprintf("Signature not yet current: %s is still later than %s (%s + %s min.)",
				f(signedAt), f(now.Add(tolerance)), f(now), mins))
	}
	return nil
}

// computeSignature returns the hex signature of canonical for the scope in
// auth, signed with secret.
func computeSignature(secret string, auth sigV4Auth, amzDate, canonical string) string {
	sum := sha256.Sum256([]byte(canonical))
	stringToSign := sigAlgorithm + "\n" + amzDate + "\n" + auth.scope() + "\n" + hex.EncodeToString(sum[:])
	key := hmacSHA256([]byte("AWS4"+secret), auth.date)
	key = hmacSHA256(key, auth.region)
	key = hmacSHA256(key, auth.service)
	key = hmacSHA256(key, "aws4_request")
	return hex.EncodeToString(hmacSHA256(key, stringToSign))
}

func hmacSHA256(key []byte, data string) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(data))
	return h.Sum(nil)
}

// canonicalRequest rebuilds the SigV4 canonical request from what arrived:
// method, URI-encoded path, canonical query, the signed headers and the hex
// SHA-256 of the body.
func canonicalRequest(r *http.Request, signedHeaders []string, body []byte) string {
	var b strings.Builder
	b.WriteString(r.Method)
	b.WriteByte('\n')
	b.WriteString(canonicalURI(r.URL))
	b.WriteByte('\n')
	b.WriteString(canonicalQuery(r.URL.RawQuery))
	b.WriteByte('\n')
	for _, h := range signedHeaders {
		b.WriteString(h)
		b.WriteByte(':')
		b.WriteString(canonicalHeaderValue(r, h))
		b.WriteByte('\n')
	}
	b.WriteByte('\n')
	b.WriteString(strings.Join(signedHeaders, ";"))
	b.WriteByte('\n')
	sum := sha256.Sum256(body)
	b.WriteString(hex.EncodeToString(sum[:]))
	return b.String()
}

// canonicalURI URI-encodes each path segment of the path as sent. For every
// service but S3 the sender encodes the already-escaped path once more, so
// the escaped form is encoded again here.
func canonicalURI(u *url.URL) string {
	p := u.EscapedPath()
	if p == "" {
		return "/"
	}
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		c := p[i]
		if c == '/' || isUnreserved(c) {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// canonicalQuery sorts parameters by name then value and encodes both per
// RFC 3986 (space as %20, only A-Za-z0-9-_.~ left bare).
func canonicalQuery(raw string) string {
	if raw == "" {
		return ""
	}
	q, err := url.ParseQuery(raw)
	if err != nil {
		return raw // cannot match the sender's view anyway; the signature check fails
	}
	for _, vs := range q {
		slices.Sort(vs)
	}
	// url.Values.Encode sorts keys and escapes everything but unreserved
	// characters, except that it writes a space as '+'.
	return strings.ReplaceAll(q.Encode(), "+", "%20")
}

// canonicalHeaderValue is the header's values, trimmed, inner runs of spaces
// collapsed, joined with commas. Go moves Host out of the header map and may
// drop Content-Length, so both are recovered from the request.
func canonicalHeaderValue(r *http.Request, name string) string {
	if name == "host" {
		return r.Host
	}
	vals := r.Header.Values(name)
	if len(vals) == 0 && name == "content-length" && r.ContentLength >= 0 {
		return strconv.FormatInt(r.ContentLength, 10)
	}
	clean := make([]string, len(vals)) // Values aliases the header map: do not edit in place
	for i, v := range vals {
		clean[i] = strings.Join(strings.Fields(v), " ")
	}
	return strings.Join(clean, ",")
}

func isUnreserved(c byte) bool {
	return 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' ||
		c == '-' || c == '_' || c == '.' || c == '~'
}

// foreignIAMHost reports whether r is addressed to the IAM endpoint of a
// partition other than the emulator's: the emulator's keys do not exist
// there, as a key of one AWS partition is unknown in another.
func (e *Emulator) foreignIAMHost(r *http.Request) bool {
	p, ok := partitionOfHost(r.Host)
	return ok && p.Name != e.partition.Name
}
