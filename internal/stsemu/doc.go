// Package stsemu is an AWS STS stand-in for tests, the dev server and
// benchmarks. It speaks the STS Query API (form-encoded POST or GET to "/",
// Version=2011-06-15, XML responses in AWS's shapes), verifies SigV4
// signatures against a root key pair and every temporary credential it has
// issued, and fails on demand: token-bucket throttling, scripted or random
// faults (throttling, 5xx, connection resets, hangs, malformed XML, expired
// or empty credentials, AccessDenied) and response latency. Counters and a
// per-second timeline of calls are readable from Go (Stats, Calls) and over a
// small JSON control API under /_emulator/.
//
// Use Start in Go tests (it listens on a random loopback port) or New to get
// a plain http.Handler; cmd/sts-emulator wraps it as a binary. See Example.
//
// # What it checks, in AWS's order
//
//  1. Action and Version (InvalidAction, MissingAction).
//  2. The token bucket (400 Throttling "Rate exceeded"), then the fault plan.
//  3. The signature: an unknown key id or a session token that does not
//     belong to it is 403 InvalidClientTokenId; expired issued credentials are
//     400 ExpiredToken; X-Amz-Date more than 15 minutes from the clock is 403
//     SignatureDoesNotMatch ("Signature expired: ..."); a wrong signature is
//     403 SignatureDoesNotMatch. Any region is accepted in the scope.
//  4. Parameters: 400 ValidationError with AWS's constraint wording
//     (DurationSeconds 900-43200 for AssumeRole and 900-129600 for the other
//     two, RoleSessionName [\w+=,.@-]{2,64}, role ARN
//     arn:aws:iam::<12 digits>:role/<path/name>, policy at most 2048
//     characters); a policy that is not a JSON object is 400
//     MalformedPolicyDocument, as AWS answers.
//  5. AssumeRole of a role in another account, or matching a deny pattern,
//     is 403 AccessDenied.
//
// # Issued credentials
//
// Access key ids are "ASIA" plus 16 characters; session tokens are several
// hundred characters. They expire at min(DurationSeconds, MaxLifetime), so a
// test can get one-second credentials although AWS's minimum request is 900s.
// Tokens are self-contained (sealed with a per-emulator key), so the emulator
// keeps no table of them: memory stays flat however many a benchmark issues,
// and long-expired credentials still get ExpiredToken. They are valid only
// for the Emulator that issued them.
package stsemu
