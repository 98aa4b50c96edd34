package soak

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"time"
)

// Link faults' own rule (late_answer_never_served): an STS answer that
// reached its node after the attempt that asked for it gave up (the
// plugin's per-call timeout, callTimeout in client.go: four fifths of a
// retry block, at most 10 s), or never reached it whole, was paid for by a
// call the plugin already counted as failed, and its role may have changed
// since: the credential it carries is never stored, so never served. The
// link proxy (internal/vaulttest.LinkProxy.LogExchanges) logs when each
// request reached the link and when the answer's last byte was handed to
// the node; the answer's AccessKeyId names the credential.

// Exchange is one exchange the link proxy carried between a node and STS
// (internal/vaulttest.LinkExchange, as its log writes it).
type Exchange struct {
	Node         int       `json:"node"`
	Source       string    `json:"source"`
	Conn         string    `json:"conn"`
	Action       string    `json:"action,omitempty"`
	InvocationID string    `json:"invocation_id,omitempty"`
	Sent         time.Time `json:"sent"`
	FirstByte    time.Time `json:"first_byte,omitzero"`
	Delivered    time.Time `json:"delivered,omitzero"`
	Status       int       `json:"status,omitempty"`
	RequestID    string    `json:"request_id,omitempty"`
	IssuedKeyID  string    `json:"issued_key_id,omitempty"`
	Error        string    `json:"error,omitempty"`
}

// ReadExchanges reads a link proxy's log, one JSON Exchange per line.
func ReadExchanges(r io.Reader) ([]Exchange, error) {
	var xs []Exchange
	err := readLines(r, func(b []byte) error {
		var x Exchange
		if err := json.Unmarshal(b, &x); err != nil {
			return err
		}
		xs = append(xs, x)
		return nil
	})
	return xs, err
}

// LateAnswer is one credential whose answer the node got too late or not
// whole.
type LateAnswer struct {
	Node, Key string
	Sent      time.Time
	// Took is how long after the request reached the link the answer's
	// last byte reached the node; -1 when it never did.
	Took time.Duration
	// Served counts the reads (and agent_file samples) that had it.
	Served int
}

// lateAnswer is why the plugin never had the credential key (""
// when it may have had it): its answer came after the attempt's deadline,
// or never whole.
func (c *checker) lateAnswer(key string) (Exchange, string) {
	x, ok := c.links[key]
	if !ok {
		return Exchange{}, ""
	}
	switch {
	case x.Delivered.IsZero():
		return x, "its answer never reached the node whole (" + x.Error + ")"
	case x.Delivered.Sub(x.Sent) > c.cfg.CallTimeout+c.cfg.Skew:
		return x, fmt.Sprintf("its answer reached the node %s after the request left, past the attempt's deadline (%s)", x.Delivered.Sub(x.Sent).Round(time.Millisecond), c.cfg.CallTimeout)
	}
	return x, ""
}

// delivered reports whether the plugin may have had the credential call
// issued: true unless the link proxy's log shows its answer never reached
// the node whole, or reached it after the attempt gave up.
func (c *checker) delivered(call STSCall) bool {
	if c.cfg.CallTimeout <= 0 {
		return true
	}
	_, why := c.lateAnswer(call.IssuedKeyID)
	return why == ""
}

// indexLinks keys the proxy's log by the credentials it carried.
func (c *checker) indexLinks(links []Exchange) {
	c.links = map[string]Exchange{}
	for _, x := range links {
		if x.IssuedKeyID != "" && isSTSIssue(x.Action) {
			c.links[x.IssuedKeyID] = x
		}
	}
}

// checkLateAnswers: no read serves, and no agent file holds, a credential
// whose answer reached its node late or not whole.
func (c *checker) checkLateAnswers() {
	if c.cfg.CallTimeout <= 0 || len(c.links) == 0 {
		return
	}
	late := map[string]*LateAnswer{}
	var order []string
	for _, o := range c.ops {
		if (o.Kind != KindRead || !o.OK) && o.Kind != KindAgentFile || o.AccessKey == "" {
			continue
		}
		x, why := c.lateAnswer(o.AccessKey)
		if why == "" {
			continue
		}
		l := late[o.AccessKey]
		if l == nil {
			took := time.Duration(-1)
			if !x.Delivered.IsZero() {
				took = x.Delivered.Sub(x.Sent)
			}
			node := c.net.topo[x.Source]
			if node == "" {
				node = x.Source
			}
			l = &LateAnswer{Node: node, Key: o.AccessKey, Sent: x.Sent, Took: took}
			late[o.AccessKey] = l
			order = append(order, o.AccessKey)
			var calls []STSCall
			if iss, ok := c.issued[o.AccessKey]; ok {
				calls = append(calls, iss)
			}
			c.violate(RuleLateAnswer, fmt.Sprintf("%s served %s, issued by a call of %s whose attempt had given up: %s", o.Kind, o.AccessKey, node, why), []Op{o}, calls)
		}
		l.Served++
	}
	sort.Strings(order)
	for _, k := range order {
		c.rep.LateServed = append(c.rep.LateServed, *late[k])
	}
}

// countLateAnswers counts, for the report, the issuing answers that
// reached their node late or not whole.
func (c *checker) countLateAnswers() {
	if c.cfg.CallTimeout <= 0 {
		return
	}
	for k := range c.links {
		if _, why := c.lateAnswer(k); why != "" {
			c.rep.LateAnswers++
		}
	}
	c.rep.Exchanges = len(c.links)
}
