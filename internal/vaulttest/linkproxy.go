package vaulttest

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// LinkFault is what a node's STS link does to the traffic the link proxy
// carries for it (zero: nothing). Packet loss and a cut link are the
// kernel's (Network.SetLinkLoss); these are the faults a kernel without
// tc netem cannot make.
type LinkFault struct {
	// Latency delays every answer from STS by this much (each chunk, in
	// order): the round trip grows by Latency.
	Latency time.Duration
	// Bandwidth caps the answers from STS at this many bytes a second.
	Bandwidth int
	// ResetAfter resets the node's connection (a TCP RST) once this many
	// bytes of an answer have reached it: a response cut halfway.
	ResetAfter int
}

func (f LinkFault) String() string {
	var s []string
	if f.Latency > 0 {
		s = append(s, "latency "+f.Latency.String())
	}
	if f.Bandwidth > 0 {
		s = append(s, fmt.Sprintf("bandwidth %d B/s", f.Bandwidth))
	}
	if f.ResetAfter > 0 {
		s = append(s, fmt.Sprintf("reset after %d B", f.ResetAfter))
	}
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

// LinkProxy is every node's STS link: inside each node's namespace it
// listens on the emulator's own loopback addresses (127.0.0.1:PORT, which
// are free there), so the mount's sts_endpoint is the emulator's URL on
// every node, as on a host without namespaces; it carries each node's
// connections to the emulator, calling from the node's SourceIP (so the
// emulator's call log names the node) through the node's LinkFault. The
// host's own clients (the awscli) call the emulator directly.
type LinkProxy struct {
	nw *Network

	mu     sync.Mutex
	faults map[int]LinkFault
	conns  map[net.Conn]bool
	lns    []net.Listener
	closed bool
	wg     sync.WaitGroup
	log    *json.Encoder // LogExchanges' (nil: none), under mu
}

// StartLinkProxy starts the link proxy of nw for the emulator listeners
// upstreams (http://127.0.0.1:PORT); it is stopped in tb.Cleanup.
func StartLinkProxy(tb testing.TB, nw *Network, upstreams ...string) *LinkProxy {
	tb.Helper()
	p := &LinkProxy{nw: nw, faults: map[int]LinkFault{}, conns: map[net.Conn]bool{}}
	tb.Cleanup(p.Close)
	var ports []int
	for _, up := range upstreams {
		target := strings.TrimPrefix(up, "http://")
		_, port, err := net.SplitHostPort(target)
		if err != nil {
			tb.Fatalf("link proxy: upstream %q: %v", up, err)
		}
		n, _ := strconv.Atoi(port)
		ports = append(ports, n)
		for i, node := range nw.Nodes {
			ln, err := listenIn(node.NS, target)
			if err != nil {
				tb.Fatalf("link proxy: listening on %s in %s: %v", target, node.NS, err)
			}
			p.mu.Lock()
			p.lns = append(p.lns, ln)
			p.mu.Unlock()
			p.wg.Add(1)
			go p.serve(ln, i, target)
		}
	}
	nw.mu.Lock()
	nw.stsPorts = append(nw.stsPorts, ports...)
	nw.mu.Unlock()
	return p
}

// listenIn listens on addr inside the network namespace ns: the socket is
// made by a thread that joined ns for the moment, and lives there; the
// thread goes back to the host's namespace (or, if it cannot, ends with
// its goroutine).
func listenIn(ns, addr string) (net.Listener, error) {
	type result struct {
		ln  net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		host, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: err}
			return
		}
		defer host.Close()
		target, err := os.Open("/run/netns/" + ns)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: err}
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: err}
			return
		}
		ln, err := net.Listen("tcp", addr)
		if unix.Setns(int(host.Fd()), unix.CLONE_NEWNET) == nil {
			// Back home: the thread may serve other goroutines again.
			runtime.UnlockOSThread()
		}
		ch <- result{ln, err}
	}()
	r := <-ch
	return r.ln, r.err
}

// SetFault sets node i's link fault; it applies to every chunk from then
// on, on connections already open too.
func (p *LinkProxy) SetFault(i int, f LinkFault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faults[i] = f
}

// Fault returns node i's link fault.
func (p *LinkProxy) Fault(i int) LinkFault {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.faults[i]
}

// Close stops listening and closes every connection.
func (p *LinkProxy) Close() {
	p.mu.Lock()
	p.closed = true
	for _, ln := range p.lns {
		ln.Close()
	}
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *LinkProxy) track(c net.Conn, on bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on && p.closed {
		return false
	}
	if on {
		p.conns[c] = true
	} else {
		delete(p.conns, c)
	}
	return true
}

func (p *LinkProxy) serve(ln net.Listener, node int, target string) {
	defer p.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.carry(c, node, target)
		}()
	}
}

// carry joins a node's connection to the emulator. Requests go up as they
// come; answers come down through the node's fault.
func (p *LinkProxy) carry(down net.Conn, node int, target string) {
	defer down.Close()
	if !p.track(down, true) {
		return
	}
	defer p.track(down, false)
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(p.nw.Nodes[node].SourceIP)}}
	up, err := d.Dial("tcp", target)
	if err != nil {
		return
	}
	defer up.Close()
	if !p.track(up, true) {
		return
	}
	defer p.track(up, false)
	x := p.exchanges(node, up)
	done := make(chan struct{}, 2)
	go func() {
		_, _ = io.Copy(up, x.tee(down))
		if tc, ok := up.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}()
	go func() {
		p.down(node, up, down, x)
		done <- struct{}{}
	}()
	<-done
	<-done
	x.wait()
}

// chunk is a piece of an answer and when it may reach the node.
type chunk struct {
	b  []byte
	at time.Time
}

// down carries the answers from up to the node's connection through its
// fault: each chunk is held for the latency in force when it arrived,
// paced to the bandwidth, and the connection is reset once ResetAfter
// bytes went down.
func (p *LinkProxy) down(node int, up, down net.Conn, x *exchangeLog) {
	q := make(chan chunk, 1024)
	go func() {
		defer close(q)
		for {
			b := make([]byte, 4096)
			n, err := up.Read(b)
			if n > 0 {
				q <- chunk{b: b[:n], at: time.Now().Add(p.Fault(node).Latency)}
			}
			if err != nil {
				return
			}
		}
	}()
	sent := 0
	for c := range q {
		time.Sleep(time.Until(c.at))
		f := p.Fault(node)
		b := c.b
		if n, cut := resetCut(sent, len(b), f.ResetAfter); cut {
			_, _ = down.Write(b[:n])
			reset(down)
			x.answered(b[:n], errReset)
			up.Close()
			for range q {
			}
			return
		}
		if err := writePaced(down, b, f.Bandwidth); err != nil {
			x.answered(nil, err)
			up.Close()
			for range q {
			}
			return
		}
		x.answered(b, nil)
		sent += len(b)
	}
	x.answered(nil, io.EOF)
	if tc, ok := down.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}

// resetCut says whether a chunk of size bytes, after sent bytes went down
// the connection, meets a reset after resetAfter bytes (0: none), and how
// much of it goes down first. A fault set while a kept-alive connection
// had already carried more than resetAfter resets it at its next chunk.
func resetCut(sent, size, resetAfter int) (n int, cut bool) {
	if resetAfter <= 0 || sent+size < resetAfter {
		return size, false
	}
	return max(0, resetAfter-sent), true
}

// writePaced writes b at most bw bytes a second (unpaced when bw is 0), in
// tenths of a second's worth.
func writePaced(c net.Conn, b []byte, bw int) error {
	if bw <= 0 {
		_, err := c.Write(b)
		return err
	}
	step := max(1, bw/10)
	for len(b) > 0 {
		n := min(step, len(b))
		if _, err := c.Write(b[:n]); err != nil {
			return err
		}
		b = b[n:]
		time.Sleep(time.Duration(n) * time.Second / time.Duration(bw))
	}
	return nil
}

// reset closes c with a TCP RST instead of a FIN.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
}

// LinkExchange is one HTTP exchange the link proxy carried between a node
// and STS, as LogExchanges records it: when the request reached the link,
// and when the answer's last byte was handed to the node (after the link's
// fault), so that a checker can tell an answer that arrived after the
// node's attempt gave up. IssuedKeyID (the answer's AccessKeyId, never a
// secret) matches it to the emulator's call log; Source is the node's
// address there.
type LinkExchange struct {
	// Node is the node's index in the network, Source its SourceIP (the
	// emulator's call log's Source), Conn the link's local address
	// towards the emulator.
	Node   int    `json:"node"`
	Source string `json:"source"`
	Conn   string `json:"conn"`
	Action string `json:"action,omitempty"`
	// InvocationID is the AWS SDK's amz-sdk-invocation-id header, the
	// same on every retry of one SDK call.
	InvocationID string `json:"invocation_id,omitempty"`
	// Sent is when the request's first byte reached the link; FirstByte
	// when the answer's first byte went down to the node; Delivered when
	// its last one did (zero: the answer never reached the node whole).
	Sent      time.Time `json:"sent"`
	FirstByte time.Time `json:"first_byte,omitzero"`
	Delivered time.Time `json:"delivered,omitzero"`
	Status    int       `json:"status,omitempty"`
	RequestID string    `json:"request_id,omitempty"`
	// IssuedKeyID is the AccessKeyId the answer carried, if any.
	IssuedKeyID string `json:"issued_key_id,omitempty"`
	// Error says why the answer did not reach the node whole.
	Error string `json:"error,omitempty"`
}

// LogExchanges writes every exchange the proxy carries from now on to w,
// one JSON LinkExchange a line.
func (p *LinkProxy) LogExchanges(w io.Writer) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.log = json.NewEncoder(w)
}

func (p *LinkProxy) record(e LinkExchange) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.log != nil {
		_ = p.log.Encode(e)
	}
}

var errReset = errors.New("reset mid-answer")

// exchangeLog follows one connection's HTTP exchanges beside the bytes the
// proxy carries (the carrying never waits on it but for the pipe's
// hand-over): the requests going up through one pipe, the answers going
// down (as the node got them) through another. nil when nothing is logged.
type exchangeLog struct {
	p                 *LinkProxy
	base              LinkExchange
	reqR, respR       *io.PipeReader
	reqW, respW       *io.PipeWriter
	pending           chan LinkExchange
	reqDone, respDone chan struct{}
	// upAt is when the bytes last handed to the request reader came up
	// (UnixNano): a request's Sent is its first bytes', not when the
	// reader got to run.
	upAt atomic.Int64
}

func (p *LinkProxy) exchanges(node int, up net.Conn) *exchangeLog {
	p.mu.Lock()
	on := p.log != nil
	p.mu.Unlock()
	if !on {
		return nil
	}
	return newExchangeLog(p, LinkExchange{Node: node, Source: p.nw.Nodes[node].SourceIP, Conn: up.LocalAddr().String()})
}

func newExchangeLog(p *LinkProxy, base LinkExchange) *exchangeLog {
	x := &exchangeLog{p: p, base: base,
		pending: make(chan LinkExchange, 64), reqDone: make(chan struct{}), respDone: make(chan struct{})}
	x.reqR, x.reqW = io.Pipe()
	x.respR, x.respW = io.Pipe()
	go x.readRequests()
	go x.readAnswers()
	return x
}

// tee returns r, its bytes also handed to the request reader.
func (x *exchangeLog) tee(r io.Reader) io.Reader {
	if x == nil {
		return r
	}
	return &teeUp{r: r, x: x}
}

type teeUp struct {
	r io.Reader
	x *exchangeLog
}

func (t *teeUp) Read(b []byte) (int, error) {
	n, err := t.r.Read(b)
	if n > 0 {
		t.x.upAt.Store(time.Now().UnixNano())
		_, _ = t.x.reqW.Write(b[:n])
	}
	if err != nil {
		t.x.reqW.Close()
	}
	return n, err
}

// answered hands b, just written to the node, to the answer reader; err
// ends the answers (io.EOF: the connection ended cleanly).
func (x *exchangeLog) answered(b []byte, err error) {
	if x == nil {
		return
	}
	if len(b) > 0 {
		_, _ = x.respW.Write(b)
	}
	if err != nil {
		x.respW.CloseWithError(err)
	}
}

func (x *exchangeLog) wait() {
	if x == nil {
		return
	}
	x.reqW.Close()
	x.respW.Close()
	<-x.reqDone
	<-x.respDone
}

func (x *exchangeLog) readRequests() {
	defer close(x.reqDone)
	defer close(x.pending)
	br := bufio.NewReader(x.reqR)
	for {
		if _, err := br.Peek(1); err != nil {
			return
		}
		e := x.base
		e.Sent = time.Unix(0, x.upAt.Load()).UTC()
		req, err := http.ReadRequest(br)
		if err != nil {
			_, _ = io.Copy(io.Discard, br)
			return
		}
		body, _ := io.ReadAll(req.Body)
		e.InvocationID = req.Header.Get("amz-sdk-invocation-id")
		v, _ := url.ParseQuery(string(body)) // what parses, when not all does
		e.Action = v.Get("Action")
		if e.Action == "" {
			e.Action = req.URL.Query().Get("Action")
		}
		x.pending <- e
	}
}

var accessKeyIDRe = regexp.MustCompile(`<AccessKeyId>\s*([A-Za-z0-9]+)\s*</AccessKeyId>`)

func (x *exchangeLog) readAnswers() {
	defer close(x.respDone)
	br := bufio.NewReader(x.respR)
	for {
		_, perr := br.Peek(1)
		first := time.Now().UTC()
		if perr != nil {
			// No answer began: the requests still waiting got none.
			for e := range x.pending {
				e.Error = "no answer: " + perr.Error()
				x.p.record(e)
			}
			return
		}
		e, ok := <-x.pending
		if !ok {
			e = x.base
		}
		e.FirstByte = first
		resp, err := http.ReadResponse(br, nil)
		if err == nil {
			e.Status = resp.StatusCode
			e.RequestID = resp.Header.Get("x-amzn-RequestId")
			var body []byte
			body, err = io.ReadAll(resp.Body)
			if m := accessKeyIDRe.FindSubmatch(body); m != nil {
				e.IssuedKeyID = string(m[1])
			}
		}
		if err != nil {
			e.Error = err.Error()
			x.p.record(e)
			_, _ = io.Copy(io.Discard, br)
			for e := range x.pending {
				e.Error = "no answer: " + err.Error()
				x.p.record(e)
			}
			return
		}
		e.Delivered = time.Now().UTC()
		x.p.record(e)
	}
}
