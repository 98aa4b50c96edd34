package stsemu

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"encoding/xml"
	"net/http"
	"time"
)

// stsNamespace is the XML namespace of every STS response.
const stsNamespace = "https://sts.amazonaws.com/doc/2011-06-15/"

// apiError is an STS or IAM error response: the HTTP status, AWS's error
// code and message.
type apiError struct {
	status  int
	code    string
	message string
}

func apiErr(status int, code, message string) *apiError {
	return &apiError{status: status, code: code, message: message}
}

func (e *apiError) Error() string { return e.code + ": " + e.message }

// errorResponse is AWS's Query-protocol error document.
type errorResponse struct {
	XMLName xml.Name `xml:"ErrorResponse"`
	Xmlns   string   `xml:"xmlns,attr"`
	Error   struct {
		Type    string `xml:"Type"`
		Code    string `xml:"Code"`
		Message string `xml:"Message"`
	} `xml:"Error"`
	RequestID string `xml:"RequestId"`
}

// errorReply renders ae in the API's namespace. AWS marks client mistakes
// "Sender" and its own failures "Receiver"; SDKs use the code, a few tools
// show the type.
func (a *api) errorReply(reqID string, ae *apiError) reply {
	var doc errorResponse
	doc.Xmlns = a.namespace
	doc.Error.Type = "Sender"
	if ae.status >= 500 {
		doc.Error.Type = "Receiver"
	}
	doc.Error.Code = ae.code
	doc.Error.Message = ae.message
	doc.RequestID = reqID
	return reply{status: ae.status, body: mustXML(doc), outcome: ae.code}
}

// responseMetadata closes every successful response.
type responseMetadata struct {
	RequestID string `xml:"RequestId"`
}

// envelope is <ActionResponse><ActionResult>...</ActionResult><ResponseMetadata/>.
type envelope struct {
	XMLName  xml.Name
	Xmlns    string `xml:"xmlns,attr"`
	Result   any
	Metadata responseMetadata `xml:"ResponseMetadata"`
}

// marshalResponse renders a successful response. A nil result (IAM's
// DeleteAccessKey, UpdateAccessKey) leaves only the ResponseMetadata.
func (a *api) marshalResponse(action string, result any, reqID string) []byte {
	return mustXML(envelope{
		XMLName:  xml.Name{Local: action + "Response"},
		Xmlns:    a.namespace,
		Result:   result,
		Metadata: responseMetadata{RequestID: reqID},
	})
}

func mustXML(v any) []byte {
	out, err := xml.Marshal(v)
	if err != nil {
		panic("stsemu: marshalling response: " + err.Error()) // static types: cannot fail
	}
	return out
}

// credentialsXML is the Credentials element shared by the issuing actions.
type credentialsXML struct {
	AccessKeyID     string `xml:"AccessKeyId"`
	SecretAccessKey string `xml:"SecretAccessKey"`
	SessionToken    string `xml:"SessionToken"`
	Expiration      string `xml:"Expiration,omitempty"` // omitted only by the no_expiration fault
}

type assumeRoleResult struct {
	XMLName         xml.Name `xml:"AssumeRoleResult"`
	SourceIdentity  string   `xml:"SourceIdentity,omitempty"`
	AssumedRoleUser struct {
		Arn           string `xml:"Arn"`
		AssumedRoleID string `xml:"AssumedRoleId"`
	} `xml:"AssumedRoleUser"`
	Credentials      credentialsXML `xml:"Credentials"`
	PackedPolicySize *int           `xml:"PackedPolicySize,omitempty"`
}

type getSessionTokenResult struct {
	XMLName     xml.Name       `xml:"GetSessionTokenResult"`
	Credentials credentialsXML `xml:"Credentials"`
}

type getFederationTokenResult struct {
	XMLName       xml.Name       `xml:"GetFederationTokenResult"`
	Credentials   credentialsXML `xml:"Credentials"`
	FederatedUser struct {
		Arn             string `xml:"Arn"`
		FederatedUserID string `xml:"FederatedUserId"`
	} `xml:"FederatedUser"`
	PackedPolicySize *int `xml:"PackedPolicySize,omitempty"`
}

type getCallerIdentityResult struct {
	XMLName xml.Name `xml:"GetCallerIdentityResult"`
	Arn     string   `xml:"Arn"`
	UserID  string   `xml:"UserId"`
	Account string   `xml:"Account"`
}

// formatExpiration renders an expiry the way STS does (ISO 8601, UTC). AWS
// usually sends whole seconds; milliseconds appear only when the expiry has
// them, which matters for the second-long lifetimes tests use.
func formatExpiration(t time.Time) string {
	return t.UTC().Format("2006-01-02T15:04:05.999Z")
}

// malformedBody is what the "malformed" fault returns: the start of a
// plausible response, cut off mid-element, as a truncated proxy reply looks.
func (a *api) malformedBody(action string) []byte {
	start := `<` + action + `Response xmlns="` + a.namespace + `">`
	switch action {
	case "GetCallerIdentity":
		return []byte(start + `<GetCallerIdentityResult><Arn>arn:aws:sts::`)
	case "GetUser":
		return []byte(start + `<GetUserResult><User><Path>/</Path><UserName>`)
	case "ListAccessKeys":
		return []byte(start + `<ListAccessKeysResult><AccessKeyMetadata><member><UserName>`)
	case "CreateAccessKey":
		return []byte(start + `<CreateAccessKeyResult><AccessKey><UserName>`)
	case "DeleteAccessKey", "UpdateAccessKey":
		// No result to cut: the metadata is. SDKs that ignore the body of
		// these actions see a success, as they would from AWS.
		return []byte(start + `<ResponseMetadata><RequestId>`)
	}
	return []byte(start + `<` + action + `Result><Credentials><AccessKeyId>ASIA`)
}

// faultError maps an error-shaped fault to the response AWS gives for it.
// callerArn and userName describe the caller as far as its key id tells
// (the signature is not checked yet); roleArn is the STS call's RoleArn.
func (a *api) faultError(f Fault, action, callerArn, userName, roleArn string) *apiError {
	switch f {
	case FaultThrottling:
		return apiErr(http.StatusBadRequest, "Throttling", "Rate exceeded")
	case FaultRequestLimitExceeded:
		return apiErr(http.StatusBadRequest, "RequestLimitExceeded", "Request limit exceeded.")
	case FaultInternalFailure:
		return apiErr(http.StatusInternalServerError, "InternalFailure",
			"The request processing has failed because of an unknown error, exception or failure.")
	case FaultServiceUnavailable:
		return apiErr(http.StatusServiceUnavailable, "ServiceUnavailable",
			"The request has failed due to a temporary failure of the server.")
	case FaultAccessDenied:
		if a.service == iamService {
			return iamAccessDenied(callerArn, action, userName)
		}
		return accessDenied(callerArn, action, roleArn)
	}
	return nil
}

// iamAccessDenied is IAM's wording for a denial of an action on a user.
func iamAccessDenied(callerArn, action, userName string) *apiError {
	return apiErr(http.StatusForbidden, "AccessDenied",
		"User: "+callerArn+" is not authorized to perform: iam:"+action+" on resource: user "+userName+
			" because no identity-based policy allows the iam:"+action+" action")
}

// accessDenied is AWS's wording for an IAM denial.
func accessDenied(callerArn, action, resource string) *apiError {
	msg := "User: " + callerArn + " is not authorized to perform: sts:" + action
	if resource != "" {
		msg += " on resource: " + resource
	}
	return apiErr(http.StatusForbidden, "AccessDenied", msg)
}

// newRequestID returns a random UUID-shaped request id, as AWS sends.
func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// stableID derives an AWS-shaped unique id (prefix + 17 upper-case
// characters, like AROA... role ids) from a name, so the same role always
// gets the same id.
func stableID(prefix, name string) string {
	sum := sha256.Sum256([]byte(name))
	return prefix + base32.StdEncoding.EncodeToString(sum[:])[:17]
}
