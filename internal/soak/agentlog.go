package soak

import (
	"bufio"
	"io"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// KindAgentRead is one read Vault Agent made of its secret, from its own
// log at trace level (ParseAgentLog): Invoke when it sent the request,
// Return when it logged the outcome; OK with Wait, the time the lease it
// got set before its next read, or a failure with Status and Error.
const KindAgentRead = "agent_read"

// agentLogLine is the start of one record of Vault Agent's log (hclog:
// time, level, message); a line without it continues the record before.
var agentLogLine = regexp.MustCompile(`^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z) \[(\w+)\]\s+(.*)$`)

var (
	agentSleep = regexp.MustCompile(`: non-renewable secret, set sleep for (\S+)`)
	agentCode  = regexp.MustCompile(`Code: (\d+)`)
)

// ParseAgentLog returns Vault Agent's reads of the secret at path (as a
// template names it: "aws-resilient/creds/soak-0") from its log at trace
// level, as agent_read ops of role through node. consul-template logs,
// for each read, "vault.read(path): GET /v1/path" before the request,
// then "vault.read(path): non-renewable secret, set sleep for 52.3s" after
// a lease it will ask again at (85-95 % of it), or "(view)
// vault.read(path): <error> (retry attempt N after "X")" (or "(exceeded
// maximum retries)") after a failure. Nothing a record holds is secret:
// the request's URL and Vault's error, never the answer.
func ParseAgentLog(r io.Reader, path, role, node string) ([]Op, error) {
	dep := "vault.read(" + path + ")"
	var out []Op
	var sent time.Time // the pending request's GET, zero when none
	finish := func(at time.Time, text string) {
		o := Op{Client: "agent", Kind: KindAgentRead, Role: role, Node: node, Invoke: sent, Return: at}
		if o.Invoke.IsZero() {
			o.Invoke = at
		}
		if m := agentSleep.FindStringSubmatch(text); m != nil {
			o.OK = true
			o.Wait, _ = time.ParseDuration(m[1])
		} else {
			if m := agentCode.FindStringSubmatch(text); m != nil {
				o.Status, _ = strconv.Atoi(m[1])
			}
			o.Error = agentError(text, dep)
		}
		out = append(out, o)
		sent = time.Time{}
	}
	record := func(at time.Time, text string) {
		switch {
		case strings.Contains(text, dep+": GET "):
			sent = at
		case agentSleep.MatchString(text) && strings.Contains(text, dep):
			finish(at, text)
		case strings.Contains(text, "(view) "+dep) && (strings.Contains(text, "(retry attempt") || strings.Contains(text, "(exceeded maximum retries)")):
			finish(at, text)
		}
	}
	var at time.Time
	var text strings.Builder
	flush := func() {
		if !at.IsZero() {
			record(at, text.String())
		}
		text.Reset()
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if m := agentLogLine.FindStringSubmatch(line); m != nil {
			flush()
			t, err := time.Parse(time.RFC3339Nano, m[1])
			if err != nil {
				at = time.Time{}
				continue
			}
			at = t
			text.WriteString(m[3])
			continue
		}
		text.WriteString("\n" + line)
	}
	flush()
	return out, sc.Err()
}

// agentError is a failure's text on one line, without the logger's name
// and the dependency's, which consul-template repeats before it.
func agentError(text, dep string) string {
	s := strings.Join(strings.Fields(text), " ")
	if i := strings.LastIndex(s, dep+": "); i >= 0 {
		s = s[i+len(dep)+2:]
	}
	if len(s) > 300 {
		s = s[:300]
	}
	return s
}
