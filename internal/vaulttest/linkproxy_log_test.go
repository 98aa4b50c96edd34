package vaulttest

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"
)

const (
	assumeForm = "Action=AssumeRole&RoleArn=arn%3Aaws%3Aiam%3A%3A1"
	assumeReq  = "POST / HTTP/1.1\r\nHost: sts\r\nAmz-Sdk-Invocation-Id: inv-1\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 48\r\n\r\n" + assumeForm
	assumeBody = "<AssumeRoleResponse><Credentials><AccessKeyId> ASIAKEY1 </AccessKeyId></Credentials></AssumeRoleResponse>"
)

func assumeResp() string {
	return "HTTP/1.1 200 OK\r\nx-amzn-RequestId: req-1\r\nContent-Length: " + itoa(len(assumeBody)) + "\r\n\r\n" + assumeBody
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// logExchange runs one exchange through an exchangeLog: the request goes
// up, then the answer comes down in two pieces, the second after a pause,
// and end ends the answers.
func logExchange(t *testing.T, end error, cut int) LinkExchange {
	t.Helper()
	var out bytes.Buffer
	p := &LinkProxy{}
	p.LogExchanges(&out)
	x := newExchangeLog(p, LinkExchange{Node: 1, Source: "10.0.0.2"})
	if _, err := io.Copy(io.Discard, x.tee(strings.NewReader(assumeReq))); err != nil {
		t.Fatal(err)
	}
	resp := assumeResp()
	if cut > 0 {
		resp = resp[:cut]
	}
	x.answered([]byte(resp[:20]), nil)
	time.Sleep(50 * time.Millisecond) // the second piece is late: Delivered is after it
	x.answered([]byte(resp[20:]), nil)
	x.answered(nil, end)
	x.wait()
	var e LinkExchange
	if err := json.Unmarshal(out.Bytes(), &e); err != nil {
		t.Fatalf("log %q: %v", out.String(), err)
	}
	return e
}

func TestLinkProxyLogsExchanges(t *testing.T) {
	e := logExchange(t, io.EOF, 0)
	if e.Action != "AssumeRole" || e.InvocationID != "inv-1" || e.IssuedKeyID != "ASIAKEY1" || e.Status != 200 || e.RequestID != "req-1" || e.Source != "10.0.0.2" || e.Error != "" {
		t.Errorf("exchange %+v", e)
	}
	if e.Delivered.Sub(e.FirstByte) < 40*time.Millisecond || e.Sent.After(e.FirstByte) {
		t.Errorf("sent %s, first byte %s, delivered %s: want the delivery after the late second piece", e.Sent, e.FirstByte, e.Delivered)
	}
	// A reset halfway: the answer never reached the node whole.
	e = logExchange(t, errReset, len(assumeResp())-10)
	if !e.Delivered.IsZero() || !strings.Contains(e.Error, "reset") || e.Action != "AssumeRole" {
		t.Errorf("a reset exchange %+v: want no delivery and the reset named", e)
	}
}
