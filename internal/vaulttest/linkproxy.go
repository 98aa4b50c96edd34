package vaulttest

import (
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
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
	done := make(chan struct{}, 2)
	go func() {
		_, _ = io.Copy(up, down)
		if tc, ok := up.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}()
	go func() {
		p.down(node, up, down)
		done <- struct{}{}
	}()
	<-done
	<-done
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
func (p *LinkProxy) down(node int, up, down net.Conn) {
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
			up.Close()
			for range q {
			}
			return
		}
		if err := writePaced(down, b, f.Bandwidth); err != nil {
			up.Close()
			for range q {
			}
			return
		}
		sent += len(b)
	}
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
