package vaulttest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/testtool"
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

// syncBuffer is a bytes.Buffer the proxy's goroutines may write to.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) exchanges(t *testing.T) []LinkExchange {
	s.mu.Lock()
	defer s.mu.Unlock()
	var xs []LinkExchange
	for _, line := range strings.Split(strings.TrimSpace(s.b.String()), "\n") {
		if line == "" {
			continue
		}
		var e LinkExchange
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		xs = append(xs, e)
	}
	return xs
}

// The link proxy's log on a real link: an answer on time, one a second
// late (the link's latency), one reset halfway; the carrying is unchanged.
func TestLinkProxyLogsRealExchanges(t *testing.T) {
	SkipUnlessEnabled(t)
	testtool.Require(t, "curl", "--version")
	nw := NewNetwork(t, 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("x-amzn-RequestId", "req-"+r.URL.Query().Get("n"))
		fmt.Fprint(w, "<AssumeRoleResponse><AccessKeyId>ASIA"+r.URL.Query().Get("n")+"</AccessKeyId>"+strings.Repeat("x", 4000)+"</AssumeRoleResponse>")
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	url := "http://" + ln.Addr().String()
	p := StartLinkProxy(t, nw, url)
	var log syncBuffer
	p.LogExchanges(&log)

	if out := curlIn(t, nw, 0, url+"/?Action=AssumeRole&n=1", 5*time.Second); !strings.HasPrefix(out, "200 ") {
		t.Fatalf("through the link proxy: %q", out)
	}
	p.SetFault(0, LinkFault{Latency: time.Second})
	if out := curlIn(t, nw, 0, url+"/?Action=AssumeRole&n=2", 5*time.Second); !strings.HasPrefix(out, "200 1.") {
		t.Errorf("with 1 s of latency: %q", out)
	}
	p.SetFault(0, LinkFault{ResetAfter: 1000})
	curlIn(t, nw, 0, url+"/?Action=AssumeRole&n=3", 5*time.Second)
	p.SetFault(0, LinkFault{})
	time.Sleep(200 * time.Millisecond) // the last exchange's record after its connection ends
	xs := log.exchanges(t)
	if len(xs) != 3 {
		t.Fatalf("logged %+v, want 3 exchanges", xs)
	}
	for i, e := range xs {
		if e.Source != nw.Nodes[0].SourceIP || e.Action != "AssumeRole" || e.IssuedKeyID != fmt.Sprintf("ASIA%d", i+1) || e.Sent.IsZero() {
			t.Errorf("exchange %d: %+v", i+1, e)
		}
	}
	if d := xs[0].Delivered.Sub(xs[0].Sent); xs[0].Delivered.IsZero() || d > 500*time.Millisecond {
		t.Errorf("the answer on time was delivered after %s", d)
	}
	if d := xs[1].Delivered.Sub(xs[1].Sent); d < time.Second || d > 2*time.Second {
		t.Errorf("the answer a second late was delivered after %s, want about 1 s", d)
	}
	if !xs[2].Delivered.IsZero() || xs[2].Error == "" {
		t.Errorf("the answer reset halfway: %+v, want no delivery and an error", xs[2])
	}
}
