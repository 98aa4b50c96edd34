// Package stsemu is an AWS STS and IAM stand-in for tests, the dev server
// and benchmarks. It speaks the STS Query API (form-encoded POST or GET to
// "/", Version=2011-06-15, XML responses in AWS's shapes) and the access-key
// part of the IAM Query API (Version=2010-05-08) on the same endpoint,
// verifies SigV4 signatures against its IAM users' access keys and every
// temporary credential it has issued, and fails on demand: token-bucket
// throttling, scripted or random faults (throttling, 5xx, connection resets,
// hangs, malformed XML, malformed credentials, AccessDenied) and response
// latency. Counters and a per-second timeline of calls are readable
// from Go (Stats, Calls) and over a small JSON control API under /_emulator/.
//
// Use Start in Go tests (it listens on a random loopback port) or New to get
// a plain http.Handler; cmd/sts-emulator wraps it as a binary. See Example.
//
// # What it checks, in AWS's order
//
//  1. Action and Version (InvalidAction, MissingAction).
//  2. The token bucket (400 Throttling "Rate exceeded"; STS calls only), then
//     the fault plan.
//  3. The signature: an unknown, deleted, inactive or not yet propagated key
//     id, or a session token that does not belong to it, is 403
//     InvalidClientTokenId; expired issued credentials are 400 ExpiredToken;
//     X-Amz-Date more than 5 minutes (Config.SkewTolerance) from the clock
//     is 403 SignatureDoesNotMatch ("Signature expired: ..."); a credential scope for
//     another service is 403 SignatureDoesNotMatch ("Credential should be
//     scoped to correct service: 'iam'. "), and so is an IAM call scoped to a
//     region other than its partition's IAM region (below); a wrong signature is 403
//     SignatureDoesNotMatch. STS accepts any region in the scope.
//  4. Parameters: 400 ValidationError with AWS's constraint wording
//     (DurationSeconds 900-43200 for AssumeRole and 900-129600 for the other
//     two, RoleSessionName and SourceIdentity [\w+=,.@-]{2,64} (so a source
//     identity cannot start with AWS's reserved "aws:"), role ARN
//     arn:aws:iam::<12 digits>:role/<path/name>, policy at most 2048
//     characters); a policy that is not a JSON object is 400
//     MalformedPolicyDocument, as AWS answers. An AssumeRole signed with
//     temporary credentials (role chaining) asking for more than an hour is
//     400 ValidationError "The requested DurationSeconds exceeds the 1 hour
//     session limit for roles assumed by role chaining."
//  5. AssumeRole of a role whose trust policy does not admit the caller
//     (below), or matching a deny pattern, is 403 AccessDenied "User:
//     CALLER is not authorized to perform: sts:AssumeRole on resource:
//     ROLE"; a source identity the role may not take, or a chained session
//     changing its own, is AccessDenied naming sts:SetSourceIdentity; then
//     a DurationSeconds over the role's MaxSessionDuration is 400
//     ValidationError "The requested DurationSeconds exceeds the
//     MaxSessionDuration set for this role."
//
// # Issued credentials
//
// Access key ids are "ASIA" plus 16 characters; session tokens are several
// hundred characters. They expire at min(DurationSeconds, MaxLifetime), so a
// test can get one-second credentials although AWS's minimum request is 900s.
// Tokens are self-contained (sealed with a per-emulator key), so the emulator
// keeps no table of them: memory stays flat however many a benchmark issues,
// and long-expired credentials still get ExpiredToken. They are valid only
// for the Emulator that issued them, and they outlive the long-term key
// that requested them (deleting it does not revoke them).
//
// # Session names and source identity
//
// AssumeRole credentials answer GetCallerIdentity as AWS's do: Arn
// arn:aws:sts::ACCOUNT:assumed-role/ROLE/SESSION, where ROLE is the last
// segment of the role ARN (its path dropped) and SESSION the RoleSessionName,
// and UserId ROLEID:SESSION, ROLEID being the role's stable AROA id that
// AssumedRoleId also reports. A SourceIdentity is echoed in the AssumeRole
// response and sealed into the issued token, and it follows role chaining
// as in AWS: a role assumed with that session inherits it when the request
// sends none, may send the same value, and gets 403 AccessDenied for
// another (AWS documents that the value cannot change, not the message; the
// emulator's names sts:SetSourceIdentity, as AWS's does for a role that
// does not allow the action). Each AssumeRole in Calls and GET /_emulator/calls
// records RoleSessionName and SourceIdentity (role_session_name,
// source_identity) as sent, "" when absent, inherited values not included;
// other actions record "". The log line of an AssumeRole ends with both.
//
// # Accounts and trust
//
// The emulator plays Config.Account (the IAM user's) and the
// Config.Accounts besides it; a configured role exists in any account. A
// role is configured by ARN (Config.Roles, SetRoles, PutRoles, the control API's
// /_emulator/roles, sts-emulator's -trust-file) with a RoleTrust: the
// principals its trust policy names ("*"; an account id or
// arn:aws:iam::ACCOUNT:root, any principal of that account; an IAM user's
// ARN, that user with its key or its GetSessionToken session; a role's
// ARN, any session of that role; one session's or federated user's ARN),
// whether it allows sts:SetSourceIdentity, and its MaxSessionDuration
// (3600 to 43200 seconds, 43200 when not set). A role nobody configured is
// what every role was before: anyone may assume it, for up to 12 h, with a
// source identity, if its account is played; elsewhere it is
// AccessDenied, as a missing role or trust policy looks to its caller.
// Identity policies are not modelled: a trusted principal has the
// permission, an account's root stands for all of its principals.
//
// A caller is the principal its signature names: the IAM user for its
// long-term key and its GetSessionToken credentials, the assumed role for
// a role session (arn:aws:sts::ACCOUNT:assumed-role/ROLE/SESSION, ROLE in
// the role's account, matched by a trust policy's role ARN by account and
// name, the path dropped as in the session ARN). An AssumeRole signed with
// temporary credentials, a role session's or GetSessionToken's, is role
// chaining, which AWS caps at one hour whatever the role's maximum: more
// is ValidationError, worded as users quote STS's answer
// (TestAWSCLIRoleChaining checks it through the awscli). AWS requires sts:SetSourceIdentity in the
// target role's trust policy for every AssumeRole carrying a source
// identity, the one a chained session inherits too, and answers
// AccessDenied "User: CALLER is not authorized to perform:
// sts:SetSourceIdentity on resource: ROLE" otherwise; a configured role
// without SetSourceIdentity does the same. GetCallerIdentity answers the
// caller's own account, so a session of a role in another account names
// that account.
//
// Every call in Calls and GET /_emulator/calls names the access key id of
// its signature (access_key_id) and, once the signature verified, the
// caller (caller_arn; "" when it did not): a test follows a chain through
// the log alone, each hop's key being the IssuedKeyID of the call that
// made it. The log line carries caller_arn too.
//
// The control API: GET /_emulator/roles lists the configured roles by ARN
// as a JSON list of {"role_arn", "trust", "set_source_identity",
// "max_session_duration"} (the last two omitted when false or 0); POST
// with such a list adds them, replacing those of the same ARN; PUT
// replaces them all; DELETE forgets them all, or one with
// ?role_arn=ARN (404 when it is not configured). A list with a malformed
// ARN or principal, a role twice, a missing trust (an empty list trusts
// nobody) or a duration out of range is 400 and changes nothing. The
// accounts played are /_emulator/config's "accounts" (Config.Account
// first; POST {"accounts": [...]} replaces the others).
//
// # IAM
//
// The emulator starts with one IAM user, Config.IAMUser (default
// "sts-emulator"), holding the configured AccessKey/SecretKey pair. STS
// calls authenticate with any active, propagated key of any user, and
// GetCallerIdentity answers with that user's ARN, arn:aws:iam::ACCOUNT:user/NAME.
// IAM serves GetUser, ListAccessKeys (MaxItems/Marker pages),
// CreateAccessKey, DeleteAccessKey and UpdateAccessKey (Status Active or
// Inactive) with IAM's XML shapes and error document (namespace
// https://iam.amazonaws.com/doc/2010-05-08/). Without UserName each acts on
// the caller's own user, as IAM does; user names are case-insensitive.
// AWS's rules:
//
//   - at most 2 keys per user, inactive ones included: 409 LimitExceeded
//     "Cannot exceed quota for AccessKeysPerUser: 2";
//   - a missing key, or a key of another user than the one named, is 404
//     NoSuchEntity "The Access Key with id ID cannot be found."; an unknown
//     user is 404 NoSuchEntity "The user with name NAME cannot be found.";
//   - an inactive or deleted key fails STS and IAM calls with 403
//     InvalidClientTokenId "The security token included in the request is
//     invalid.";
//   - new keys are "AKIA" and 16 random upper-case base32 characters, with
//     a 40-character random secret;
//   - for Config.IAMPropagation after CreateAccessKey (measured on
//     Config.Now, fixed when the key is made) the new key fails STS and IAM
//     calls with InvalidClientTokenId, like IAM's eventual consistency,
//     while ListAccessKeys already lists it;
//   - for Config.IAMWindows.Inconsistency after that, each call with the
//     new key is refused with probability IAMWindows.Refusal (drawn from a
//     hash of Seed, the key's ordinal and its use count, so a seeded
//     emulator refuses the same calls of each key), as when some of IAM's
//     endpoints have not seen the key yet;
//   - Config.IAMWindows.RefuseFirst is the same inconsistency made
//     certain: the first N AssumeRole, GetSessionToken and
//     GetFederationToken calls signed with each new key that would
//     otherwise be served (well signed, past the propagation delay) are
//     refused with InvalidClientTokenId, whenever they come, while
//     GetCallerIdentity and IAM calls accept the key and do not count, as
//     when the endpoint that verified the key has seen it and the one
//     serving credentials has not; the configured key is never refused;
//   - for Config.IAMWindows.Revocation after DeleteAccessKey the deleted key
//     still signs STS and IAM calls, although it is no longer listed nor
//     counted against the quota, as a deleted key "may keep working for a
//     few seconds" in AWS;
//   - IAM refuses GetSessionToken credentials obtained without MFA and
//     GetFederationToken credentials with InvalidClientTokenId, as AWS does;
//     role credentials must name the user ("Must specify userName when
//     calling with non-User credentials"). Policies are not modelled: every
//     authenticated caller may manage every user's keys.
//
// One endpoint serves both APIs, as AWS's SDKs send both to a configured
// endpoint URL. A request is routed by its Action, whose STS and IAM names
// are disjoint and which is known before anything is verified, so unsigned
// and mis-signed requests get their own API's errors, faults and stats; the
// credential scope is then held to the action's service (and IAM's region),
// so a client that signs an IAM call for "sts" fails here as it would
// against AWS instead of being served. A missing or unknown Action is
// answered in the API its scope names.
//
// Faults apply to IAM calls that FaultPlan.Actions selects ("CreateAccessKey",
// "iam:*", "*", ...); a plan without Actions faults STS calls only, as it
// always did. The reset_after fault lets the call take effect and then
// resets the connection, so a client cannot tell whether its key was made
// or deleted. The token bucket is STS's only: AWS throttles IAM separately.
// Stats and Calls record IAM calls by action like STS calls. The control API
// lists users and keys (GET /_emulator/iam/users, never a secret) and sets
// the propagation delay and the windows (POST /_emulator/config
// {"iam_propagation": "5s", "iam_inconsistency": "10s",
// "iam_inconsistency_refusal": 0.5, "iam_revocation": "5s",
// "iam_refuse_first": 3}).
//
// # Malformed credentials
//
// The credential shapes (CredentialShapes) answer an issuing action
// (AssumeRole, GetSessionToken, GetFederationToken) with a 200 whose
// Credentials element has one field bent, each a way a proxy or a broken
// endpoint could answer: empty_key, empty_secret and empty_token empty
// AccessKeyId, SecretAccessKey or SessionToken; no_expiration leaves the
// Expiration element out (the SDK's Expiration is then nil, its
// aws.ToTime the zero time); expired and far_expiration issue a credential
// that expired a minute ago or expires FarExpiration from now, the token
// enforcing it; whitespace wraps AccessKeyId, SecretAccessKey and
// SessionToken in a newline and spaces, leaving the Expiration exact (a
// padded timestamp is a parse error in the SDKs, what malformed gives).
// The rest of the credential is genuine and signs calls. They take a
// plan's Sequence and Probability like any fault, so a plan with match
// "role/app" and {"fault":"empty_token","count":1} bends the next
// credential of that role only; a call that issues nothing answers
// normally (expired and empty_key excepted, see their constants), with
// outcome ok, and still uses up its step.
//
// # Partitions
//
// Config.Partition picks the AWS partition played: aws (the default),
// aws-us-gov or aws-cn. Every ARN names it (arn:aws-us-gov:iam::...,
// arn:aws-cn:sts::...), AssumeRole of a role ARN of another partition is
// AccessDenied, and IAM accepts only the partition's IAM region in the
// signature's scope: us-east-1, us-gov-west-1 or cn-north-1, as IAM's
// global endpoints iam.amazonaws.com, iam.us-gov.amazonaws.com and
// iam.cn-north-1.amazonaws.com.cn do. A request whose Host is another
// partition's IAM endpoint is InvalidClientTokenId: keys of one partition do
// not exist in another.
package stsemu
