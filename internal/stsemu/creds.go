package stsemu

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/base64"
	"encoding/binary"
	"strings"
	"time"
)

// Principal kinds: who signed a request.
const (
	kindUser       = "user"         // a long-term access key of an IAM user
	kindSession    = "session"      // GetSessionToken credentials of that user
	kindSessionMFA = "session-mfa"  // the same, requested with an MFA code
	kindRole       = "assumed-role" // AssumeRole credentials
	kindFederated  = "federated"    // GetFederationToken credentials
)

// principal is the identity behind a verified signature.
type principal struct {
	kind        string
	arn         string
	userID      string
	accessKeyID string
	userName    string // the IAM user, for kindUser only (not sealed in tokens)

	// sourceIdentity is the SourceIdentity of an assumed-role session
	// (kindRole only). It is sealed in the token because AWS carries it
	// into every role assumed with that session; see assumeRole. The
	// session name needs no field of its own: arn and userID end in it.
	sourceIdentity string
}

// tempCred is what an issued session token carries.
type tempCred struct {
	principal
	expires time.Time
}

// Issued credentials are stateless: the session token carries the key id,
// identity and expiry, sealed with an HMAC under a per-emulator random key,
// and the secret is an HMAC of the key id. Verifying a call signed with them
// needs no lookup table, so memory stays bounded however many credentials a
// benchmark issues, every expired token can still be recognised as expired
// (ExpiredToken rather than InvalidClientTokenId, like AWS), and nothing
// needs sweeping. This is also how AWS's own tokens behave: self-contained
// and opaque to the client.

// tokenPadding makes tokens as long as real ones (AWS's run to several
// hundred characters), so clients that store or forward them see realistic
// sizes.
const tokenPadding = 320

// issue mints credentials for p that expire at expires.
func (e *Emulator) issue(p principal, expires time.Time) credentialsXML {
	p.accessKeyID = newAccessKeyID()
	return credentialsXML{
		AccessKeyID:     p.accessKeyID,
		SecretAccessKey: e.secretFor(p.accessKeyID),
		SessionToken:    e.sealToken(tempCred{principal: p, expires: expires}),
		Expiration:      formatExpiration(expires),
	}
}

// newAccessKeyID returns a unique temporary key id: "ASIA" and 16 base32
// characters (80 random bits), 20 characters like AWS's.
func newAccessKeyID() string {
	var b [10]byte
	_, _ = rand.Read(b[:])
	return "ASIA" + base32.StdEncoding.EncodeToString(b[:])
}

// secretFor derives the secret key of an issued access key id.
func (e *Emulator) secretFor(accessKeyID string) string {
	mac := hmac.New(sha256.New, e.sealKey)
	mac.Write([]byte("secret\x00" + accessKeyID))
	return base64.StdEncoding.EncodeToString(mac.Sum(nil))[:40]
}

// sealToken encodes tc as mac(32) | len(2) | fields | random padding.
func (e *Emulator) sealToken(tc tempCred) string {
	fields := strings.Join([]string{
		tc.kind, tc.accessKeyID, tc.arn, tc.userID, tc.sourceIdentity,
		string(binary.BigEndian.AppendUint64(nil, uint64(tc.expires.UnixNano()))),
	}, "\x00")
	raw := make([]byte, 0, 2+len(fields)+tokenPadding)
	raw = binary.BigEndian.AppendUint16(raw, uint16(len(fields)))
	raw = append(raw, fields...)
	pad := make([]byte, tokenPadding)
	_, _ = rand.Read(pad)
	raw = append(raw, pad...)
	mac := hmac.New(sha256.New, e.sealKey)
	mac.Write(raw)
	return base64.StdEncoding.EncodeToString(append(mac.Sum(nil), raw...))
}

// openToken verifies and decodes a session token issued by this emulator.
func (e *Emulator) openToken(token string) (tempCred, bool) {
	b, err := base64.StdEncoding.DecodeString(token)
	if err != nil || len(b) < sha256.Size+2 {
		return tempCred{}, false
	}
	sum, raw := b[:sha256.Size], b[sha256.Size:]
	mac := hmac.New(sha256.New, e.sealKey)
	mac.Write(raw)
	if !hmac.Equal(sum, mac.Sum(nil)) {
		return tempCred{}, false
	}
	n := int(binary.BigEndian.Uint16(raw))
	if 2+n > len(raw) {
		return tempCred{}, false
	}
	f := strings.Split(string(raw[2:2+n]), "\x00")
	// The expiry is 8 binary bytes and may itself contain NULs; it is last,
	// so rejoin everything after the fifth field. The others never contain
	// a NUL: their AWS patterns exclude it.
	if len(f) < 6 {
		return tempCred{}, false
	}
	exp := strings.Join(f[5:], "\x00")
	if len(exp) != 8 {
		return tempCred{}, false
	}
	return tempCred{
		principal: principal{kind: f[0], accessKeyID: f[1], arn: f[2], userID: f[3], sourceIdentity: f[4]},
		expires:   time.Unix(0, int64(binary.BigEndian.Uint64([]byte(exp)))),
	}, true
}
